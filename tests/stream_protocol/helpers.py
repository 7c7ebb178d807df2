"""What the stream-protocol tests share: a client connected for the length of a body, waits on a condition,
confirmed publishing, and AMQP 1.0 messages each RabbitMQ line converts for an AMQP 0-9-1 reader."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Symbol, Timestamp
from spark_amqp.stream_protocol.client import StreamClient

from .conftest import stream_options


def run(url: str, body: Callable[[StreamClient], Awaitable[Any]], **extra: str) -> Any:
    """What ``body`` returns, run with a client connected to ``url`` (closed after it)."""

    async def main() -> Any:
        client = await StreamClient.connect(stream_options(url, **extra), "spark-amqp test")
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Until ``check()`` holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def publish(client: StreamClient, stream: str, messages: list[bytes], reference: str = "", first_id: int = 1) -> list[int]:
    """Publish and wait for every confirm; the publishing ids confirmed."""
    confirmed: list[int] = []
    errors: list[tuple[int, int]] = []
    await client.declare_publisher(9, reference, stream, confirmed.extend, errors.extend)
    client.publish(9, [(first_id + i, m) for i, m in enumerate(messages)])
    await until(lambda: len(confirmed) + len(errors) >= len(messages))
    await client.delete_publisher(9)
    assert errors == []
    return confirmed


def native_messages(version: tuple[int, int]) -> list[bytes]:
    """AMQP 1.0 messages an AMQP 0-9-1 reader of that version can take."""
    props = [
        "id-1",
        b"guest",
        None,
        None,
        "rt",
        "cid",
        Symbol("application/json"),
        Symbol("utf8"),
        None,
        Timestamp(1_700_000_000_123),
        "group",
    ]
    out = [
        amqp10.encode(b"data only"),
        amqp10.encode(b"props", properties=props),
        amqp10.encode(b"apps", application_properties={"s": "x", "ts": Timestamp(1_704_164_645_000), "bin": b"\xff\x00", "n": None}),
        amqp10.encode(b"routed", annotations={Symbol("x-exchange"): "ex", Symbol("x-routing-key"): "rk"}),
    ]
    if version >= (4, 0):  # 3.10 refuses these for AMQP 0-9-1 (541): a header section, ulongs, symbols, other annotations
        out += [
            amqp10.encode(b"header", header=[True, 7, 5000]),
            amqp10.encode(b"ints", application_properties={"i": 42, "neg": -7, "b": False, "sym": Symbol("sy")}),
            amqp10.encode(b"annotated", annotations={Symbol("x-opt-foo"): "bar"}),
            b"\x00Su\xa0\x03one\x00Su\xa0\x03two",
        ]
    return out
