"""Stream queues (``x-queue-type: stream``) as RabbitMQ 4.x serves them over AMQP 0-9-1.

An append-only log: messages get offsets from 0 and are written in chunks (what
arrived in one event-loop pass stands in for one batch of RabbitMQ's stream
writer). Chunks fill segments; a segment after the first opens with a tracking
chunk that takes one offset no consumer ever sees, so offsets have gaps there,
as on RabbitMQ. Retention drops whole segments from the head, and only when a
new segment is started.

A consumer reads from its own position, one message per unit of credit (prefetch
minus unacked), as RabbitMQ 4.x does (3.10 sent a chunk whole whatever the
credit). Acks, nacks and rejects only give credit back. Every refusal carries
RabbitMQ's reply code and text (see tests/broker/test_streams.py).

The same log serves the stream protocol (``stream_port``): its publishes are records
of their own (``stream_records.NativeRecord``), its subscribers read whole chunks
(``Chunk.osiris``) and are woken with the AMQP 0-9-1 consumers. ``store_offset`` is
written with the pass's batch, as osiris writes tracking with its writer's batch: in the
trailer of the chunk of the messages that came with it, or, with none, as a tracking
chunk of its own, which takes an offset as the segments' tracking chunks do.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from spark_amqp import errors
from spark_amqp.stream_protocol import chunks as osiris

from .message import Message, with_header_entries
from .stream_args import StreamArguments, start_spec, where
from .stream_filter import ChunkFilter, ConsumerFilter, chunk_filter, consumer_filter
from .stream_records import NativeRecord, Record, SubEntry, amqp10_bytes, record_size, with_delivery_mode

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import Queue

# RabbitMQ's writer batches what is in its mailbox; chunks of a few hundred small
# messages were seen from a fast publisher. Capping keeps a burst from one read from
# turning into one huge chunk.
MAX_CHUNK_RECORDS = 256
# Rough on-disk sizes (chunk header, per-record framing plus the AMQP 1.0 encoding of
# the properties): with 100-byte bodies and 1000-byte segments both brokers put about
# four one-message chunks in a segment.
CHUNK_OVERHEAD = 64
RECORD_OVERHEAD = 96
TRACKING_CHUNK_SIZE = 64
TRAILER_ENTRY = 10  # and the id's bytes
_OFFSET_KEY = struct.Struct(">q")
_SIZE = struct.Struct(">I")


def is_stream(arguments: dict[str, Any]) -> bool:
    kind = arguments.get("x-queue-type")
    return kind in ("stream", b"stream")


class Subscriber(Protocol):
    """A stream-protocol subscription: woken whenever a chunk is written."""

    def wake(self) -> None: ...


class Watcher(Protocol):
    """A stream-protocol connection that publishes to or reads the stream: told when it is deleted."""

    def stream_gone(self, queue: StreamQueue) -> None: ...


class Chunk:
    __slots__ = ("filter", "first", "records", "timestamp_ms", "trailer", "wire")

    def __init__(self, first: int, timestamp_ms: int, records: list[Record], tracked: Iterable[str] = ()) -> None:
        self.first = first
        self.timestamp_ms = timestamp_ms
        self.records = records
        self.filter: ChunkFilter = chunk_filter(records)
        # osiris' trailer holds an entry (type, id size, id, 64 bits) per writer with messages in the chunk
        # and per offset stored with them, which deduplication and query_offset read back; a reader is sent
        # the header, whose trailer length counts them, but not the trailer.
        self.trailer = sum(TRAILER_ENTRY + len(i.encode()) for i in tracked)
        self.wire: bytes | None = None

    @property
    def next(self) -> int:
        return self.first + len(self.records)

    def osiris(self) -> bytes:
        """The chunk as a stream-protocol reader gets it (osiris' layout, AMQP 1.0 records, sub-entries whole), built on
        its first read."""
        if self.wire is None:
            entries: list[tuple[bytes, int]] = []
            last: SubEntry | None = None
            for r in self.records:
                entry = r.entry if isinstance(r, NativeRecord) else None
                if entry is None:
                    entries.append((_SIZE.pack(len(raw := amqp10_bytes(r))) + raw, 1))
                elif entry is not last:  # its records follow each other in one chunk
                    entries.append((entry.wire, entry.records))
                last = entry
            self.wire = osiris.build_entries(self.first, entries, self.timestamp_ms, trailer_length=self.trailer)
        return self.wire


class Segment:
    __slots__ = ("chunks", "first", "newest_ms", "size")

    def __init__(self, first: int, size: int, newest_ms: int) -> None:
        self.first = first
        self.size = size
        self.chunks = 0
        self.newest_ms = newest_ms


class StreamQueue:
    """Duck-types ``Queue`` for the vhost, exchanges and channels."""

    is_stream = True
    is_quorum = False
    exclusive_owner = None
    auto_delete = False
    ready: tuple[()] = ()

    def __init__(self, name: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]) -> None:
        self.name = name
        self.durable = durable
        self.arguments = arguments
        self.args = StreamArguments(name, arguments, durable, exclusive, auto_delete)
        self.consumers: list[Consumer] = []
        self.deleted = False
        self.had_consumer = False
        self.unacked = 0
        self.next_offset = 0
        self.chunks: list[Chunk] = []
        self._firsts: list[int] = []  # chunk first offsets, for bisect
        self.segments: list[Segment] = []
        self._open: list[Record] = []
        self._open_writers: dict[str, None] = {}  # the writers of the records in _open, in order
        self._open_tracking: dict[str, None] = {}  # references whose stored offset awaits the batch
        self._seal_handle: asyncio.Handle | None = None
        self.readers: list[Subscriber] = []
        self.watchers: set[Watcher] = set()
        self.writer_sequences: dict[str, int] = {}  # the highest publishing id stored, by publisher reference
        self.tracked_offsets: dict[str, int] = {}  # store_offset's, by reference
        self.last_chunk_id = -1  # tracking chunks included

    # -- what the vhost and channels ask of any queue -------------------------

    @property
    def head(self) -> int:
        """The first offset still in the log (possibly a tracking chunk's)."""
        return self.segments[0].first if self.segments else self.next_offset

    @property
    def message_count(self) -> int:
        # RabbitMQ reports committed offset + 1 minus the first offset, gaps included,
        # from statistics that lag by up to a few seconds; here it is never stale.
        return self.next_offset - self.head

    @property
    def consumer_count(self) -> int:
        return 0  # RabbitMQ 3.10 does not count stream consumers in declare-ok

    def get(self) -> Message | None:
        raise errors.NotImplemented_(f"basic.get not supported by stream queues {where(self.name)}")

    def purge(self) -> int:
        raise errors.NotImplemented_(f"queue.purge not supported by stream queues {where(self.name)}")

    def requeue(self, messages: Any, counted: bool = True) -> None:
        """Returned deliveries (a closed channel, a nack): nothing to give back, the log keeps them."""

    def reject(self, message: Message) -> None:
        """A reject or nack without requeue: the log keeps it too."""

    def expire_head(self) -> None:
        """Streams have no per-message TTL."""

    def delete(self) -> int:
        self.deleted = True
        if self._seal_handle is not None:
            self._seal_handle.cancel()
            self._seal_handle = None
        self.chunks, self._firsts, self.segments, self._open = [], [], [], []
        self._open_writers, self._open_tracking = {}, {}
        for consumer in list(self.consumers):
            consumer.cancelled_by_server()
        self.consumers.clear()
        self.readers.clear()
        for watcher in list(self.watchers):
            watcher.stream_gone(self)
        self.watchers.clear()
        return 0

    def equivalent(self, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]) -> str | None:
        from .queue import _b, inequivalent

        if durable != self.durable:
            return f"inequivalent arg 'durable' for {where(self.name)}: received '{_b(durable)}' but current is '{_b(self.durable)}'"
        for key in ("x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes"):  # RabbitMQ's order
            mine, theirs = self.arguments.get(key), arguments.get(key)
            if mine != theirs:
                return inequivalent(self.name, key, theirs, mine)
        return None

    # -- writing -------------------------------------------------------------

    def publish(self, message: Record, now: float, writer: str | None = None) -> bool:
        """``writer``: the id osiris writes it under (a producer's name, an AMQP 0-9-1 channel's own id),
        None for an unnamed stream-protocol producer and for dead-lettering, which write without one."""
        self._open.append(message)
        if writer is not None:
            self._open_writers[writer] = None
        if len(self._open) >= MAX_CHUNK_RECORDS:
            self._seal()
        elif self._seal_handle is None:
            self._seal_handle = asyncio.get_running_loop().call_soon(self._seal)
        return True

    def publish_together(self, records: Sequence[Record], now: float, writer: str | None = None) -> None:
        """Records that must share a chunk (a sub-entry's, or one message's)."""
        if self._open and len(self._open) + len(records) > MAX_CHUNK_RECORDS:
            self._seal()
        self._open.extend(records[:-1])
        self.publish(records[-1], now, writer)

    def _seal(self) -> None:
        if self._seal_handle is not None:
            self._seal_handle.cancel()
            self._seal_handle = None
        records, self._open = self._open, []
        writers, self._open_writers = self._open_writers, {}
        tracking, self._open_tracking = self._open_tracking, {}
        if self.deleted:
            return
        if not records:
            if tracking:
                self._write_tracking_chunk()
            return
        now_ms = int(time.time() * 1000)
        size = CHUNK_OVERHEAD + sum(RECORD_OVERHEAD + record_size(m) for m in records)
        if not self.segments:
            self.segments.append(Segment(self.next_offset, 0, now_ms))
        elif self.segments[-1].size >= self.args.segment_bytes:
            self.segments.append(Segment(self.next_offset, TRACKING_CHUNK_SIZE, now_ms))
            self.next_offset += 1
            self._retain(now_ms)
        first = self.next_offset
        for i, message in enumerate(records):
            if isinstance(message, NativeRecord):
                message.offset = first + i
                continue
            # RabbitMQ stores stream messages as AMQP 1.0; headers come back sorted by key.
            offset = {"x-stream-offset": b"l" + _OFFSET_KEY.pack(first + i)}
            message.header = with_delivery_mode(with_header_entries(message.header, offset, sort_keys=True))
        self.chunks.append(Chunk(first, now_ms, records, [*writers, *tracking]))
        self._firsts.append(first)
        self.next_offset = first + len(records)
        self.last_chunk_id = first
        segment = self.segments[-1]
        segment.size += size
        segment.chunks += 1
        segment.newest_ms = now_ms
        self.dispatch()

    def store_offset(self, reference: str, offset: int) -> None:
        """Tracking, written with this pass's batch; a query sees it at once (osiris answers from its pending tracking too)."""
        self.tracked_offsets[reference] = offset
        self._open_tracking[reference] = None
        if self._seal_handle is None:
            self._seal_handle = asyncio.get_running_loop().call_soon(self._seal)

    def _write_tracking_chunk(self) -> None:
        """Tracking that came without messages: a chunk that takes one offset no reader sees, as RabbitMQ's does."""
        if not self.segments:
            self.segments.append(Segment(self.next_offset, 0, int(time.time() * 1000)))
        self.last_chunk_id = self.next_offset
        self.next_offset += 1
        self.segments[-1].size += TRACKING_CHUNK_SIZE

    def stats(self) -> dict[str, int]:
        """stream_stats as RabbitMQ 4.3 answers it: chunk ids are first offsets, -1 while there is no chunk."""
        if self.last_chunk_id < 0:
            return dict.fromkeys(("committed_chunk_id", "committed_offset", "first_chunk_id", "last_chunk_id"), -1)
        last = self.last_chunk_id
        return {"committed_chunk_id": last, "committed_offset": self.next_offset - 1, "first_chunk_id": self.head, "last_chunk_id": last}

    def _retain(self, now_ms: int) -> None:
        """Drop whole segments from the head, never the one being written."""
        max_bytes, max_age = self.args.max_bytes, self.args.max_age_ms
        total = sum(s.size for s in self.segments)
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_big = max_bytes is not None and total > max_bytes
            too_old = max_age is not None and oldest.newest_ms < now_ms - max_age
            if not (too_big or too_old):
                break
            del self.chunks[: oldest.chunks]
            del self._firsts[: oldest.chunks]
            self.segments.pop(0)
            total -= oldest.size

    # -- reading ---------------------------------------------------------------

    def check_consume(self, arguments: dict[str, Any], no_ack: bool, prefetch: int) -> tuple[str, int, ConsumerFilter | None]:
        """RabbitMQ's checks, in its order; the consumer's start and filter on success."""
        kind, value = start_spec(self.name, arguments.get("x-stream-offset"))
        if "x-priority" in arguments:
            raise errors.PreconditionFailed(f"invalid arg 'x-priority' for {where(self.name)} of queue type rabbit_stream_queue")
        if not prefetch:
            raise errors.PreconditionFailed(f"consumer prefetch count is not set for stream {where(self.name)}")
        if no_ack:
            raise errors.NotImplemented_(f"automatic acknowledgement not supported by stream {where(self.name)}")
        return kind, value, consumer_filter(arguments)

    def add_consumer(self, consumer: Consumer, spec: tuple[str, int, ConsumerFilter | None] = ("next", 0, None)) -> None:
        consumer.position = self._start(spec[:2])
        consumer.stream_filter = spec[2]
        self.consumers.append(consumer)
        self.had_consumer = True

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def _start(self, spec: tuple[str, int]) -> int:
        kind, value = spec
        if kind == "first":
            return self.head
        if kind == "last":
            return self.chunks[-1].first if self.chunks else self.next_offset
        if kind == "offset":
            return max(value, self.head)  # before the head (or negative): from the first offset kept
        if kind == "timestamp":
            for chunk in self.chunks:
                if chunk.timestamp_ms >= value:
                    return chunk.first
        return self.next_offset

    def reader_start(self, kind: str, value: int) -> int:
        """Where a stream-protocol subscription starts; an offset past the end waits for the next chunk."""
        start = self._start((kind, value))
        return min(start, self.next_offset) if kind == "offset" else start

    def chunk_from(self, position: int, wanted: ConsumerFilter | None) -> tuple[Chunk | None, int]:
        """The chunk a stream-protocol reader at ``position`` gets next (the one holding that offset, or
        the first after it its filter passes), and the reader's position past the chunks it skipped."""
        chunks = self.chunks
        position = max(position, self.head)
        i = max(bisect.bisect_right(self._firsts, position) - 1, 0)
        while i < len(chunks):
            chunk = chunks[i]
            i += 1
            if chunk.next <= position:
                continue
            if wanted is None or wanted.passes(chunk.filter):
                return chunk, position
            position = chunk.next
        return None, position

    def dispatch(self) -> None:
        for consumer in list(self.consumers):
            self._feed(consumer)
        for reader in list(self.readers):
            reader.wake()

    def _feed(self, consumer: Consumer) -> None:
        chunks = self.chunks
        while chunks and consumer.can_take():
            position = max(consumer.position, self.head)
            i = max(bisect.bisect_right(self._firsts, position) - 1, 0)
            if chunks[i].next <= position:
                i += 1
            if i >= len(chunks):
                return
            chunk = chunks[i]
            if consumer.stream_filter is not None and not consumer.stream_filter.passes(chunk.filter):
                consumer.position = chunk.next
                continue
            as_queue = cast("Queue", self)
            # RabbitMQ 4.x honours the prefetch inside a chunk (3.10 sent the rest of it whole).
            for index in range(max(position - chunk.first, 0), len(chunk.records)):
                if not consumer.can_take():
                    consumer.position = chunk.first + index
                    return
                record = chunk.records[index]
                if isinstance(record, NativeRecord) and record.skipped:
                    continue  # as RabbitMQ 4.x: its offset is missing from what AMQP 0-9-1 readers get
                if consumer.raw_records:  # an AMQP 1.0 reader: the record as stored, with its offset
                    consumer.deliver_record(as_queue, record, chunk.first + index)
                    continue
                if isinstance(record, NativeRecord):
                    try:
                        record = record.message(self.name)
                    except errors.AmqpReplyError as err:  # RabbitMQ's reader crashes on it: 541 for the connection
                        consumer.channel.connection.close_with(err)
                        return
                consumer.deliver(as_queue, record)
            consumer.position = chunk.next
