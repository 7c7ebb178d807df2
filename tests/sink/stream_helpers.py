"""Streams on a real broker for the stream sink's tests: create, delete, read back everything a stream holds, and a
publisher's connection dropped under it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
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


def drop_after(monkeypatch: pytest.MonkeyPatch, confirms: int, times: int = 1) -> list[int]:
    """Abort the publisher's connection once it has ``confirms`` confirms (``times`` times): a dropped connection."""
    dropped: list[int] = []
    original = StreamPartitionPublisher._on_confirm

    def on_confirm(self: StreamPartitionPublisher, target: int, ids: list[int]) -> None:
        original(self, target, ids)
        if len(dropped) < times and self.confirmed >= confirms * (len(dropped) + 1) and self._client is not None:
            dropped.append(self.confirmed)
            transport = self._client.transport
            assert transport is not None
            transport.abort()

    monkeypatch.setattr(StreamPartitionPublisher, "_on_confirm", on_confirm)
    return dropped
