"""A receiver's credit as the broker's flows and transfers move it, without a broker: a flow answering an echo sent
before the last grant must not take that grant's credit away, and a drain says whether the broker ran out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from spark_amqp.amqp10_client.links import Receiver


class _Client:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.options = SimpleNamespace(connection_timeout=5.0)
        self.flows: list[tuple[int, int, bool]] = []

    def flow(self, link: Receiver, credit: int, drain: bool, echo: bool = False) -> None:
        self.flows.append((link.delivery_count, credit, drain))


def _receiver(loop: asyncio.AbstractEventLoop, initial: int = 0) -> tuple[Receiver, list[int]]:
    got: list[int] = []
    client: Any = _Client(loop)
    receiver = Receiver(client, 0, "r", "/queues/q", lambda delivery_id, message: got.append(delivery_id))
    receiver.delivery_count = initial
    return receiver, got


def test_a_late_answer_to_an_echo_leaves_the_last_grant_its_credit() -> None:
    loop = asyncio.new_event_loop()
    try:
        r, got = _receiver(loop)
        r.grant(10)
        for i in range(2):
            r._transfer(i, False, b"m")
        r.grant(20)  # 20 more from delivery-count 2
        r._flow(2, 0, None)  # the broker's answer to an echo sent with the first grant, when it had none left
        assert r.credit == 20
        for i in range(2, 22):
            r._transfer(i, False, b"m")
        assert r.credit == 0 and got == list(range(22))
    finally:
        loop.close()


def test_a_drain_says_whether_the_broker_ran_out_across_the_serial_wrap() -> None:
    loop = asyncio.new_event_loop()
    try:
        r, _ = _receiver(loop, initial=0xFFFFFFFE)
        r.grant(5)
        r._transfer(0, False, b"m")
        drained = loop.create_task(r.drain())
        loop.run_until_complete(asyncio.sleep(0))
        r._flow(3, 0, None)  # delivery-count 0xFFFFFFFE + 5, wrapped: four of the credit used up without a transfer
        assert loop.run_until_complete(drained) is True and r.credit == 0 and r.delivery_count == 3

        r.grant(2)
        r._transfer(1, False, b"m")
        r._transfer(2, False, b"m")
        drained = loop.create_task(r.drain())
        loop.run_until_complete(asyncio.sleep(0))
        r._flow(5, 0, None)  # the credit went on transfers: there may be more
        assert loop.run_until_complete(drained) is False and r.credit == 0
    finally:
        loop.close()
