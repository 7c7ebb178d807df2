"""Reading a stream range over RabbitMQ's stream protocol: whole chunks, as they are on disk.

The subscription starts at the range's first offset with ``CREDIT`` chunks of
credit, and gets one more chunk of credit for each chunk that arrives, until the
range's end has come. Each chunk's CRC is checked before any of it becomes a row; records become rows as an
AMQP 0-9-1 read would make them, so the same offsets give the same rows over either
protocol. Where the compiled core is installed (``stream_protocol.core``) it takes a whole
chunk at once, range and row filter included, into Arrow columns; a chunk it leaves to
Python goes through ``chunks.records`` and ``RowMaker`` as everywhere else, in its place.

The broker ends the subscription itself when its stream is deleted (a metadata
update): that is a lost subscription, resumed like a lost connection, and the
resume finds out what became of the stream.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConnectionLost
from ..stream_protocol import chunks
from ..stream_protocol.client import OffsetSpec, StreamClient
from ..stream_protocol.rows import Conversion, RowMaker
from ..stream_protocol.topology import connect_to_member
from .options import StreamSourceOptions
from .protocol_probe import free_subscription
from .range_base import RangeReader
from .ranges import StreamRange

__all__ = ["CREDIT", "ProtocolRangeReader", "subscription_properties"]

# Chunks in flight. RabbitMQ cuts chunks as writes arrive: PerfTest's 300k confirmed
# publishes made 11,302 chunks of 27 messages (8 KB) on average, so a small credit leaves the
# reader waiting a round trip per few chunks. Reading them (no Spark): 3 chunks 97-110k msg/s,
# 10 chunks 164-196k, 30 chunks 208-232k. 10 keeps a task's buffered bytes to ten chunks.
CREDIT = 10


def subscription_properties(arguments: dict[str, Any]) -> dict[str, str]:
    """The stream-protocol form of a filter's consumer arguments (``filtering.consumer_arguments``)."""
    values = arguments.get("x-stream-filter")
    if values is None:
        return {}
    listed = [values] if isinstance(values, str) else list(values)
    properties = {f"filter.{i}": str(v) for i, v in enumerate(listed)}
    if arguments.get("x-stream-match-unfiltered"):
        properties["match-unfiltered"] = "true"
    return properties


class ProtocolRangeReader(RangeReader):
    def __init__(self, options: StreamSourceOptions, part: StreamRange) -> None:
        super().__init__(options, part)
        self.sub = -1
        self.owed = 0  # chunks of credit held back while full
        self.maker: RowMaker | None = None

    async def _connect(self) -> None:
        # A node that holds the stream (a subscription elsewhere gets 0x06): asked again after every lost
        # connection or metadata update, so a reader follows its stream through failovers.
        connection = self.outage.attempt_options(self.options.connection)
        client = await connect_to_member(connection, self.part.stream, f"spark-amqp stream reader {self.part.stream}")
        self.client = client
        client.on_metadata_update = self._on_metadata_update
        client.closed.add_done_callback(lambda closed: self._on_closed(client, closed))
        conversion = Conversion.of(client.server_version)
        made = self.options.made  # the columns the query asks for (and what the row filter reads): no others are decoded
        self.maker = RowMaker(self.part.stream, conversion, made)
        self._use_core(conversion)
        await self.access.require(client, self.options)

    async def _subscribe(self) -> None:
        client: StreamClient = self.client
        self.failure, self.owed = None, 0
        self.sub = free_subscription(client)
        self.subscribed = True
        properties = subscription_properties(self.broker_filter)
        await client.subscribe(self.sub, self.part.stream, OffsetSpec.offset(self.next_offset), CREDIT, self._on_chunk, properties)

    async def _unsubscribe(self) -> None:
        # Chunks that come before the answer are still read (in order): the next subscription starts after them.
        client: StreamClient | None = self.client
        self.subscribed = False
        if client is not None and self.sub in client.subscriptions:
            await client.unsubscribe(self.sub)

    def _on_closed(self, client: StreamClient, closed: Any) -> None:
        if client is self.client and self.failure is None and not self.done:  # not one given up on in _resume
            self.failure = closed.result()
            self.arrived.set()

    def _on_metadata_update(self, code: int, stream: str) -> None:
        if stream == self.part.stream and self.failure is None and not self.done:
            self.failure = ConnectionLost(f"the broker ended the subscription to stream '{stream}' (metadata update, code {code:#04x})")
            self.arrived.set()

    def _on_chunk(self, data: memoryview) -> None:
        if self.done or self.failure is not None:
            return
        try:
            header = chunks.read_header(data)
            first = header.first_offset
            skip = max(0, self.next_offset - first)
            # The core checks the whole chunk as chunks.records does, and adds the rows of the range the filter keeps
            # (none when the chunk holds none of it); or it leaves the chunk to Python, having added nothing.
            taken = self.rows.add_chunk(data, skip, max(skip, min(header.records, self.part.end - first)))
            records = [] if taken else chunks.records(data, header)
        except Exception as err:  # a damaged chunk: nothing of it becomes a row, and the task fails
            self.failure = err
            self.arrived.set()
            return
        count = header.records if taken else len(records)  # the same: the core took a chunk with that many
        if skip >= count:
            self._credit()
            return  # all before the offset asked for
        stop = min(count, self.part.end - first)
        if stop <= skip:
            self._offered(first + skip)  # a jump past the range's end: noted, and the range is done
            self.arrived.set()
            return
        assert self.maker is not None
        self._offered(first + skip)  # the jump into this chunk, if any; every offset of a chunk holds a message
        if not taken:
            row = self.maker.row
            stream_rows = [row(records[i], first + i) for i in range(skip, stop)]
            if self.row_filter is not None:
                keeps = self.row_filter.keeps
                stream_rows = [r for r in stream_rows if keeps(r[5])]
            self.rows.extend(stream_rows)
        self.next_offset = first + stop
        if self.next_offset >= self.part.end:
            self.done = True
        else:
            self._credit()
        self.arrived.set()

    def _credit(self) -> None:
        self.owed += 1
        if not self.full:
            self._refill()

    def _refill(self) -> None:
        if self.owed and self.client is not None and self.subscribed:
            self.client.credit(self.sub, self.owed)
            self.owed = 0
