"""A stream's ends and messages, asked over RabbitMQ's stream protocol (``probe`` does it over AMQP 0-9-1).

A subscription with one credit gets one chunk: at ``last`` the stream's last
chunk, at ``first`` its oldest, at an offset the chunk that holds it, at a
timestamp the first chunk written at or after it. A consumer never sees the
tracking chunks RabbitMQ writes (one opens each segment), so these answers are
messages, as over AMQP 0-9-1, and give the same offsets.

Where the broker has ``stream_stats`` (3.11+), an empty stream is known at once
(``committed_chunk_id`` is -1); RabbitMQ 3.10 closes the connection on that
request, so there a stream that sends nothing within ``EMPTY_WAIT`` is empty,
as an AMQP 0-9-1 probe concludes. The stats' own offsets are chunk ids (4.0) or
may name a tracking chunk (4.3's ``committed_offset`` after a consumer stored
its offset), so the end itself comes from the last chunk: the next offset after
its last message, which a range can read up to.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import AmqpSourceError, StreamResponseError
from ..rabbitmq import FILTER_VALUE_HEADER
from ..stream_protocol import chunks
from ..stream_protocol.client import OffsetSpec, StreamClient
from ..stream_protocol.rows import Conversion, RowMaker
from ..stream_protocol.super_streams import STREAM_DOES_NOT_EXIST, partitions_by_name
from ..stream_protocol.topology import STREAM_NOT_AVAILABLE, member_client
from ..stream_protocol.wire import OK
from .waits import EMPTY_WAIT

__all__ = [
    "Chunk",
    "chunk_data",
    "chunk_for",
    "filter_value_at",
    "free_subscription",
    "has_stats",
    "head",
    "last_chunk",
    "message_at",
    "offset_at",
    "partitions_of",
    "tail",
]

STATS_SINCE = (3, 11)
MAX_SUBSCRIPTIONS = 256  # a subscription id is one byte
_AT_OFFSET, _AT_TIMESTAMP = OffsetSpec.offset(0)[0], OffsetSpec.timestamp(0)[0]


class Chunk:
    """One delivered chunk: its header and its records (CRC checked)."""

    __slots__ = ("header", "records")

    def __init__(self, data: bytes | memoryview) -> None:
        self.header = chunks.read_header(data)
        self.records = chunks.records(data, self.header)

    def at(self, offset: int) -> tuple[int, bytes]:
        """The offset and record of the first message at or after ``offset`` in this chunk."""
        index = max(0, offset - self.header.first_offset)
        return self.header.first_offset + index, self.records[min(index, len(self.records) - 1)]


def has_stats(client: StreamClient) -> bool:
    return client.server_version is None or client.server_version >= STATS_SINCE


def free_subscription(client: StreamClient) -> int:
    for sub in range(MAX_SUBSCRIPTIONS):
        if sub not in client.subscriptions:
            return sub
    raise AmqpSourceError("all 256 subscription ids of one stream-protocol connection are in use")


async def last_chunk(client: StreamClient, stream: str) -> Chunk | None:
    """The stream's last chunk; None when it has none."""
    patience = client.options.connection_timeout
    if has_stats(client):
        if (await client.stats(stream)).get("committed_chunk_id", -1) < 0:
            return None
    else:
        await _exists(client, stream)  # say "does not exist" rather than "empty"
        patience = EMPTY_WAIT
    return await _one_chunk(client, stream, OffsetSpec.LAST, patience)


async def chunk_for(client: StreamClient, stream: str, spec: tuple[int, int]) -> Chunk | None:
    """The first chunk a subscription at ``spec`` gets; None when the stream has none there. Asked only
    once the last chunk shows that one will come: an empty answer is never a wait."""
    last = await last_chunk(client, stream)
    if last is None or spec == OffsetSpec.LAST:
        return last
    kind, value = spec
    if kind == _AT_OFFSET and value >= last.header.first_offset:
        return last
    if kind == _AT_TIMESTAMP and value > last.header.timestamp_ms:
        return None
    return await _one_chunk(client, stream, spec, client.options.connection_timeout)


async def _one_chunk(client: StreamClient, stream: str, spec: tuple[int, int], patience: float) -> Chunk | None:
    data = await chunk_data(client, stream, spec, patience)
    return None if data is None else Chunk(data)


async def chunk_data(client: StreamClient, stream: str, spec: tuple[int, int], patience: float) -> bytes | None:
    """The first chunk a subscription at ``spec`` gets, as it came (nothing decoded); None if none within ``patience``."""
    got: asyncio.Future[bytes] = client.loop.create_future()

    def on_chunk(data: memoryview) -> None:
        if not got.done():
            got.set_result(bytes(data))

    sub = free_subscription(client)
    try:
        await client.subscribe(sub, stream, spec, 1, on_chunk)
    except StreamResponseError as err:
        if err.code != STREAM_NOT_AVAILABLE:
            raise
        # This node holds no member of the stream: ask one that does (a connection kept for such questions).
        client = await member_client(client, stream)
        sub = free_subscription(client)
        await client.subscribe(sub, stream, spec, 1, on_chunk)
    try:
        return await asyncio.wait_for(asyncio.shield(got), patience)
    except TimeoutError:
        return None  # RabbitMQ 3.10: an empty stream
    finally:
        if not client.closed.done():
            await client.unsubscribe(sub)


async def _exists(client: StreamClient, stream: str) -> None:
    code, _leader = (await client.metadata(stream)).get(stream, (STREAM_DOES_NOT_EXIST, None))
    if code != OK:
        raise StreamResponseError(code, f"stream '{stream}'")


def _body(client: StreamClient, stream: str, offset: int, record: bytes) -> tuple[bytes, Any]:
    """The body and properties the source makes of a record: the same bytes an AMQP 0-9-1 read gives."""
    row = RowMaker(stream, Conversion.of(client.server_version)).row(record, offset)
    return row[0], row[5]


async def tail(client: StreamClient, stream: str) -> tuple[int, bytes] | None:
    """The offset and body of the stream's last message; None if it has none."""
    chunk = await last_chunk(client, stream)
    if chunk is None:
        return None
    last = chunk.header.next_offset - 1
    return last, _body(client, stream, last, chunk.records[-1])[0]


async def head(client: StreamClient, stream: str) -> int | None:
    """The first offset still in the stream; None if empty."""
    chunk = await chunk_for(client, stream, OffsetSpec.FIRST)
    return None if chunk is None else chunk.header.first_offset


async def message_at(client: StreamClient, stream: str, offset: int) -> tuple[int, bytes] | None:
    """The offset and body of the first message at or after ``offset``; None if the stream has none there."""
    chunk = await chunk_for(client, stream, OffsetSpec.offset(offset))
    if chunk is None or chunk.header.next_offset <= offset:
        return None
    at, record = chunk.at(offset)
    return at, _body(client, stream, at, record)[0]


async def filter_value_at(client: StreamClient, stream: str, offset: int) -> tuple[int, str | None] | None:
    """The offset and filter value (the message's ``x-stream-filter-value`` property) of the first message
    at or after ``offset``; None if the stream has none there."""
    chunk = await chunk_for(client, stream, OffsetSpec.offset(offset))
    if chunk is None or chunk.header.next_offset <= offset:
        return None
    at, record = chunk.at(offset)
    return at, _body(client, stream, at, record)[1].text_header(FILTER_VALUE_HEADER)


async def offset_at(client: StreamClient, stream: str, epoch_ms: int) -> int | None:
    """The first offset of the first chunk written at or after ``epoch_ms``, to the second as over AMQP 0-9-1
    (whose timestamps are seconds), so that a query starts at the same offset over either protocol."""
    chunk = await chunk_for(client, stream, OffsetSpec.timestamp(epoch_ms // 1000 * 1000))
    return None if chunk is None else chunk.header.first_offset


async def partitions_of(client: StreamClient, super_stream: str) -> tuple[str, ...]:
    """The super stream's partitions, in order, as the broker lists them (its ``partitions`` command)."""
    if has_stats(client):
        try:
            found = await client.partitions(super_stream)
        except StreamResponseError as err:
            if err.code != STREAM_DOES_NOT_EXIST:
                raise
            found = []
    else:
        found = await partitions_by_name(client, super_stream)
    if not found:
        raise AmqpSourceError(
            f"super stream '{super_stream}' does not exist. Declare it (rabbitmq-streams add_super_stream), or give its "
            "partitions' names with option 'stream'"
        )
    return tuple(found)
