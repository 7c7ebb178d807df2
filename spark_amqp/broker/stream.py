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
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import re
import struct
import time
from typing import TYPE_CHECKING, Any, cast

from .. import errors
from .message import Message, with_header_entries
from .stream_filter import ChunkFilter, ConsumerFilter, chunk_filter, consumer_filter

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import Queue

# Arguments RabbitMQ 3.10 knows for other queue types and refuses on a stream.
KNOWN_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-quorum-initial-group-size",
)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's default segment size
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
_AGE_UNITS_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
_AGE = re.compile(r"^([0-9]*)(.*)$", re.DOTALL)
_OFFSET_KEY = struct.Struct(">q")


def is_stream(arguments: dict[str, Any]) -> bool:
    kind = arguments.get("x-queue-type")
    return kind in ("stream", b"stream")


def _where(name: str) -> str:
    return f"queue '{name}' in vhost '/'"


def internal_error() -> errors.AmqpReplyError:
    # RabbitMQ crashes on an x-stream-offset of a type it does not expect: a bare 541 closes the connection.
    err = errors.InternalError("internal error")
    err.text = "INTERNAL_ERROR"
    return err


def age_ms(value: str) -> int | None:
    """An age such as ``10s``, ``1m`` (minute), ``1M`` (month), ``2D``, ``1Y`` in ms; None if invalid (406).

    RabbitMQ 3.10 and 4.0 crashed (541) on one with no leading digits; 4.3 refuses it with 406."""
    digits, unit = _AGE.match(value).groups()  # type: ignore[union-attr]
    if not digits or unit not in _AGE_UNITS_MS or int(digits) == 0:
        return None
    return int(digits) * _AGE_UNITS_MS[unit]


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, str):
        return "longstr"
    return type(value).__name__


class StreamArguments:
    """A stream's declare arguments and properties, refused as RabbitMQ 3.10 refuses them."""

    def __init__(self, name: str, args: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool) -> None:
        where = _where(name)
        self.max_bytes = self._size(where, args, "x-max-length-bytes")
        self.segment_bytes = self._size(where, args, "x-stream-max-segment-size-bytes") or DEFAULT_SEGMENT_BYTES
        self.max_age_ms: int | None = None
        if "x-max-age" in args:
            value = args["x-max-age"]
            if not isinstance(value, str):
                raise errors.PreconditionFailed(f"invalid arg 'x-max-age' for {where}: {{unacceptable_type,{_type_name(value)}}}")
            self.max_age_ms = age_ms(value)
            if self.max_age_ms is None:
                raise errors.PreconditionFailed(f"invalid arg 'x-max-age' for {where}: invalid_max_age")
        if "x-initial-cluster-size" in args and args["x-initial-cluster-size"] == 0:
            raise errors.PreconditionFailed(f"invalid arg 'x-initial-cluster-size' for {where}: {{value_zero,0}}")
        locator = args.get("x-queue-leader-locator")
        if locator is not None and locator not in LEADER_LOCATORS:
            raise errors.PreconditionFailed(f"invalid arg 'x-queue-leader-locator' for {where}: invalid_queue_locator_arg")
        # Observed order: auto-delete, then exclusive, then non-durable.
        for refused, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
            if refused:
                raise errors.PreconditionFailed(f"invalid property '{prop}' for {where}")
        for key in KNOWN_ARGUMENTS:
            if key in args:
                raise errors.PreconditionFailed(f"invalid arg '{key}' for {where} of queue type rabbit_stream_queue")

    @staticmethod
    def _size(where: str, args: dict[str, Any], key: str) -> int | None:
        if key not in args:
            return None
        value = args[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.PreconditionFailed(f"invalid arg '{key}' for {where}: \"expected integer, got {_type_name(value)}\"")
        if value < 0:
            raise errors.PreconditionFailed(f"invalid arg '{key}' for {where}: {{value_negative,{value}}}")
        return value


def start_spec(name: str, value: Any) -> tuple[str, int]:
    """Where a consumer starts, from its ``x-stream-offset``: (kind, value), kind one of
    first / last / next / offset / timestamp (ms)."""
    if value is None:
        return ("next", 0)
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        raise internal_error()
    if isinstance(value, int):
        return ("offset", value)
    if isinstance(value, datetime.datetime):
        return ("timestamp", int(value.timestamp()) * 1000)
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return (value, 0)
        interval = age_ms(value)
        if interval is not None:
            return ("timestamp", int(time.time() * 1000) - interval)
        raise errors.PreconditionFailed(
            f"invalid arg 'x-stream-offset' for {_where(name)}: {{invalid_stream_offset_arg,{{longstr,<<\"{value}\">>}}}}"
        )
    raise internal_error()


class Chunk:
    __slots__ = ("filter", "first", "records", "timestamp_ms")

    def __init__(self, first: int, timestamp_ms: int, records: list[Message]) -> None:
        self.first = first
        self.timestamp_ms = timestamp_ms
        self.records = records
        self.filter: ChunkFilter = chunk_filter(records)

    @property
    def next(self) -> int:
        return self.first + len(self.records)


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
        self._open: list[Message] = []
        self._seal_handle: asyncio.Handle | None = None

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
        raise errors.NotImplemented_(f"basic.get not supported by stream queues {_where(self.name)}")

    def purge(self) -> int:
        raise errors.NotImplemented_(f"queue.purge not supported by stream queues {_where(self.name)}")

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
        for consumer in list(self.consumers):
            consumer.cancelled_by_server()
        self.consumers.clear()
        return 0

    def equivalent(self, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]) -> str | None:
        from .queue import _b, inequivalent

        if durable != self.durable:
            return f"inequivalent arg 'durable' for {_where(self.name)}: received '{_b(durable)}' but current is '{_b(self.durable)}'"
        for key in ("x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes"):  # RabbitMQ's order
            mine, theirs = self.arguments.get(key), arguments.get(key)
            if mine != theirs:
                return inequivalent(self.name, key, theirs, mine)
        return None

    # -- writing -------------------------------------------------------------

    def publish(self, message: Message, now: float) -> bool:
        self._open.append(message)
        if len(self._open) >= MAX_CHUNK_RECORDS:
            self._seal()
        elif self._seal_handle is None:
            self._seal_handle = asyncio.get_running_loop().call_soon(self._seal)
        return True

    def _seal(self) -> None:
        if self._seal_handle is not None:
            self._seal_handle.cancel()
            self._seal_handle = None
        records, self._open = self._open, []
        if not records or self.deleted:
            return
        now_ms = int(time.time() * 1000)
        size = CHUNK_OVERHEAD + sum(RECORD_OVERHEAD + len(m.header) + len(m.body) for m in records)
        if not self.segments:
            self.segments.append(Segment(self.next_offset, 0, now_ms))
        elif self.segments[-1].size >= self.args.segment_bytes:
            self.segments.append(Segment(self.next_offset, TRACKING_CHUNK_SIZE, now_ms))
            self.next_offset += 1
            self._retain(now_ms)
        first = self.next_offset
        for i, message in enumerate(records):
            # RabbitMQ stores stream messages as AMQP 1.0; headers come back sorted by key.
            offset = {"x-stream-offset": b"l" + _OFFSET_KEY.pack(first + i)}
            message.header = with_header_entries(message.header, offset, sort_keys=True)
        self.chunks.append(Chunk(first, now_ms, records))
        self._firsts.append(first)
        self.next_offset = first + len(records)
        segment = self.segments[-1]
        segment.size += size
        segment.chunks += 1
        segment.newest_ms = now_ms
        self.dispatch()

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
            raise errors.PreconditionFailed(f"invalid arg 'x-priority' for {_where(self.name)} of queue type rabbit_stream_queue")
        if not prefetch:
            raise errors.PreconditionFailed(f"consumer prefetch count is not set for stream {_where(self.name)}")
        if no_ack:
            raise errors.NotImplemented_(f"automatic acknowledgement not supported by stream {_where(self.name)}")
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

    def dispatch(self) -> None:
        for consumer in list(self.consumers):
            self._feed(consumer)

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
                consumer.deliver(as_queue, chunk.records[index])
            consumer.position = chunk.next
