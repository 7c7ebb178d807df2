"""Streams on a real broker for the stream sink's tests: create, delete, and read back everything a stream holds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from tests.stream_protocol.conftest import stream_options

MARKER = b"end-of-test-"


def run(url: str, body: Callable[[StreamClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        client = await StreamClient.connect(stream_options(url), "spark-amqp sink test")
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def create(url: str, *streams: str, **arguments: str) -> None:
    async def body(c: StreamClient) -> None:
        for s in streams:
            await c.create(s, arguments)

    run(url, body)


def delete(url: str, *streams: str) -> None:
    async def body(c: StreamClient) -> None:
        for s in streams:
            await c.delete(s)

    run(url, body)


async def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def records(url: str, stream: str) -> list[bytes]:
    """Every record the stream holds: a marker goes in last (unnamed publisher), then the stream is read up to it
    (markers left out)."""
    marker = MARKER + uuid.uuid4().hex.encode()

    async def body(c: StreamClient) -> list[bytes]:
        confirmed: list[int] = []
        await c.declare_publisher(200, "", stream, confirmed.extend, lambda errors: None)
        c.publish(200, [(1, marker)])
        await until(lambda: bool(confirmed))
        await c.delete_publisher(200)
        got: list[bytes] = []

        def on_chunk(view: memoryview) -> None:
            got.extend(chunks.records(view, chunks.read_header(view)))
            c.credit(1, 1)

        await c.subscribe(1, stream, OffsetSpec.FIRST, 2, on_chunk)
        await until(lambda: marker in got)
        await c.unsubscribe(1)
        return [r for r in got[: got.index(marker)] if not r.startswith(MARKER)]  # earlier reads' markers too

    return run(url, body)  # type: ignore[no-any-return]
