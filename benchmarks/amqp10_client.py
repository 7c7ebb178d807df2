"""Our AMQP 1.0 client against python-qpid-proton (the reference AMQP 1.0 implementation, on which RabbitMQ's own
Python AMQP 1.0 client builds), with our AMQP 0-9-1 client and raw pika beside them, on one RabbitMQ 4.x queue in one run.

    .venv/bin/python -m pip install python-qpid-proton==0.40.0   # no dependency of the project: the baseline only
    .venv/bin/python benchmarks/amqp10_client.py --url amqp://guest:guest@127.0.0.1:5690/%2F [--messages 100000] [--rounds 3]

On one durable classic queue, ``--rounds`` rounds, each client in turn (the first one rotating from round to round):

- consume: ``--messages`` x 200 B preloaded with pika, then read whole. Ours over AMQP 1.0: credit 1000, set again every
  500 deliveries, and one disposition settling (accepted) each 1000 as a range, as the queue source would over AMQP 1.0.
  proton: its reactor and ``MessagingHandler`` with credit 1000 (``prefetch``), every delivery accepted as it comes (its
  default, and what its API settles by: one delivery at a time). Ours over AMQP 0-9-1 and pika: prefetch 1000, one
  multi-ack every 1000 (``benchmarks/amqp_client.py``).
- publish: ``--messages`` x 200 B, durable, at most 1000 unsettled: ours over AMQP 1.0 through a sender link waiting for
  credit and counting the broker's ``accepted`` outcomes; proton sending while it has credit and counting
  ``on_accepted``; ours over AMQP 0-9-1 (the sink's publisher, confirms) and pika.

The client's CPU per message is this process's ``time.process_time``; the broker's from /proc when the process behind
``--url``'s port is found. What limits it: the broker and the clients share the machine's 2 cores, so a rate moves with
whatever else runs; CPU per message is the steadier figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import urllib.parse
from importlib.metadata import version as version_of
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import amqp_client as ac
from machine import listening_pid

from spark_amqp import amqp10
from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.option_reader import OptionReader
from spark_amqp.transport.options import CONNECTION_KEYS, parse_connection

BODY = ac.BODY
QUEUE = "bench.amqp10-client"
CREDIT = 1000
SETTLE_EVERY = 1000
WINDOW = 1000
CLIENTS = ("amqp 1.0 ours", "amqp 1.0 proton", "0-9-1 ours", "0-9-1 pika")


def _address(queue: str) -> str:
    return f"/queues/{urllib.parse.quote(queue, safe='')}"


async def ours_consume(url: str, queue: str, count: int) -> None:
    client = await Amqp10Client.connect(parse_connection(OptionReader({"uri": url}, CONNECTION_KEYS)), "benchmark consumer")
    done = asyncio.get_running_loop().create_future()
    state = {"got": 0, "first": -1}

    def on_delivery(delivery_id: int, payload: bytes) -> None:
        state["got"] += 1
        if state["first"] < 0:
            state["first"] = delivery_id
        got = state["got"]
        if got % (CREDIT // 2) == 0:
            receiver.grant(CREDIT)
        if got % SETTLE_EVERY == 0 or got == count:
            receiver.settle(state["first"], delivery_id)
            state["first"] = -1
        if got == count and not done.done():
            done.set_result(None)

    try:
        receiver = await client.receiver(_address(queue), on_delivery)
        receiver.grant(CREDIT)
        await done
        await receiver.detach()
    finally:
        await client.close()


async def ours_publish(url: str, queue: str, count: int) -> None:
    client = await Amqp10Client.connect(parse_connection(OptionReader({"uri": url}, CONNECTION_KEYS)), "benchmark publisher")
    settled = [0, 0]  # accepted, other
    progress = asyncio.Event()

    def on_outcome(first: int, last: int, code: int, values: list[Any]) -> None:
        settled[0 if code == 0x24 else 1] += last - first + 1
        progress.set()

    message = amqp10.encode(BODY, header=[True])
    try:
        sender = await client.sender(_address(queue), on_outcome)
        sent = 0
        while sent < count:
            while sender.credit <= 0 or sent - sum(settled) >= WINDOW:
                sender.credit_changed.clear()
                progress.clear()
                await asyncio.wait(
                    [asyncio.ensure_future(sender.credit_changed.wait()), asyncio.ensure_future(progress.wait())],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            sender.send(message)
            sent += 1
            if sent % 256 == 0:
                await asyncio.sleep(0)
        while sum(settled) < count:
            progress.clear()
            await asyncio.wait_for(progress.wait(), 60)
        if settled[1]:
            raise RuntimeError(f"ours: {settled[1]} of {count} not accepted")
        await sender.detach()
    finally:
        await client.close()


def proton_consume(url: str, queue: str, count: int) -> None:
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    parts = urllib.parse.urlsplit(url)

    class Receive(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=CREDIT)
            self.got = 0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(
                f"{parts.hostname}:{parts.port}", user=parts.username, password=parts.password, allowed_mechs="PLAIN"
            )
            event.container.create_receiver(conn, _address(queue))

        def on_message(self, event: Any) -> None:
            self.got += 1
            if self.got == count:
                event.receiver.close()
                event.connection.close()

    Container(Receive()).run()


def proton_publish(url: str, queue: str, count: int) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    parts = urllib.parse.urlsplit(url)

    class Send(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.sent = self.accepted = self.other = 0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(
                f"{parts.hostname}:{parts.port}", user=parts.username, password=parts.password, allowed_mechs="PLAIN"
            )
            event.container.create_sender(conn, _address(queue))

        def on_sendable(self, event: Any) -> None:
            while event.sender.credit and self.sent < count and self.sent - self.accepted - self.other < WINDOW:
                event.sender.send(Message(body=BODY, durable=True))
                self.sent += 1

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            self._done(event)

        def on_rejected(self, event: Any) -> None:
            self.other += 1
            self._done(event)

        def on_released(self, event: Any) -> None:
            self.other += 1
            self._done(event)

        def _done(self, event: Any) -> None:
            if self.accepted + self.other == count:
                event.connection.close()

    handler = Send()
    Container(handler).run()
    if handler.other:
        raise RuntimeError(f"proton: {handler.other} of {count} not accepted")


def consume(client: str, url: str, queue: str, count: int) -> None:
    if client == "amqp 1.0 ours":
        asyncio.run(ours_consume(url, queue, count))
    elif client == "amqp 1.0 proton":
        proton_consume(url, queue, count)
    else:
        ac.consume("ours" if client == "0-9-1 ours" else "pika", url, queue, count)


def publish(client: str, url: str, queue: str, count: int) -> None:
    if client == "amqp 1.0 ours":
        asyncio.run(ours_publish(url, queue, count))
    elif client == "amqp 1.0 proton":
        proton_publish(url, queue, count)
    else:
        ac.publish("ours" if client == "0-9-1 ours" else "pika", url, queue, count)


def purge(url: str, queue: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_purge(queue)
    finally:
        conn.close()


def report(test: str, samples: dict[str, list[ac.Sample]]) -> None:
    mean = {c: ac.Sample(*(statistics.mean(field) for field in zip(*s, strict=True))) for c, s in samples.items()}
    for client, runs in samples.items():
        m = mean[client]
        each = " / ".join(f"{r.rate:,.0f}" for r in runs)
        broker = f"; broker {m.broker_us:5.1f} us/msg" if m.broker_us else ""
        print(f"  {test:7s} {client:15s}: {m.rate:8,.0f} msg/s ({each}); client CPU {m.cpu_us:5.1f} us/msg{broker}")
    ours, proton, classic = mean["amqp 1.0 ours"], mean["amqp 1.0 proton"], mean["0-9-1 ours"]
    print(
        f"  {test}: ours over AMQP 1.0 = {ours.rate / proton.rate:.2f}x proton's rate at {ours.cpu_us / proton.cpu_us:.2f}x its CPU "
        f"a message; {ours.rate / classic.rate:.2f}x our AMQP 0-9-1 client's rate (means)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="a RabbitMQ 4.x node (AMQP 1.0 on its AMQP port)")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    broker = listening_pid(urllib.parse.urlsplit(args.url).port or 5672)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{args.messages} x {len(BODY)} B, {args.rounds} rounds; proton {version_of('python-qpid-proton')}; load average {load}")
    consumed: dict[str, list[ac.Sample]] = {c: [] for c in CLIENTS}
    published: dict[str, list[ac.Sample]] = {c: [] for c in CLIENTS}
    for round_ in range(args.rounds):
        order = CLIENTS[round_ % len(CLIENTS) :] + CLIENTS[: round_ % len(CLIENTS)]
        for client in order:
            ac.preload(args.url, QUEUE, args.messages)
            consumed[client].append(ac.timed(lambda c=client: consume(c, args.url, QUEUE, args.messages), args.messages, broker))  # type: ignore[misc]
            ac.expect(args.url, QUEUE, 0, f"{client} consumed")
        for client in order:
            published[client].append(ac.timed(lambda c=client: publish(c, args.url, QUEUE, args.messages), args.messages, broker))  # type: ignore[misc]
            ac.expect(args.url, QUEUE, args.messages, f"{client} published")
            purge(args.url, QUEUE)
    report("consume", consumed)
    report("publish", published)


if __name__ == "__main__":
    main()
