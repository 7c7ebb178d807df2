"""The stream protocol's commands on the embedded broker, answered as RabbitMQ 4.3 answers them.

Each handler follows rabbit_stream_reader.erl: its checks in RabbitMQ's order, its response
codes (``errors.STREAM_CODES``), and what it does to the connection's state. Streams are the
vhost's ``StreamQueue``s, shared with AMQP 0-9-1. A connection watches the streams it
publishes to, reads, or looked up a leader of (publisher, offsets): when one is deleted,
by any protocol, it drops what it had there and gets one metadata update (code 6), as
RabbitMQ's monitor on the stream's leader gives it.

Publishes are confirmed once their chunk is written (the next event-loop pass). With a
publisher reference the stream keeps the highest publishing id per reference and drops a
message whose id is not above it, confirming it all the same (osiris' deduplication).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from spark_amqp.errors import DecodeError
from spark_amqp.stream_protocol.wire import OK, Key, Reader, frame, response, string

from .stream import StreamQueue
from .stream_filter import ConsumerFilter, protocol_filter
from .stream_publishers import MAX_REFERENCE, Publisher, StreamPublishers
from .stream_super import StreamSuper

if TYPE_CHECKING:
    from .queue import Queue
    from .server import BrokerServer

log = logging.getLogger("spark_amqp_broker")
Handler = Callable[[Reader, int], None]

STREAM_DOES_NOT_EXIST, SUBSCRIPTION_EXISTS, NO_SUBSCRIPTION, STREAM_EXISTS = 0x02, 0x03, 0x04, 0x05
STREAM_NOT_AVAILABLE, PRECONDITION_FAILED, NO_PUBLISHER, NO_OFFSET = 0x06, 0x11, 0x12, 0x13
MAX_SUBSCRIPTIONS = 255  # per connection
# What exchange_command_versions answers: (key, min, max), as RabbitMQ 4.3 lists them.
COMMAND_VERSIONS = (
    (0x01, 1, 1), (0x02, 1, 2), (0x05, 1, 1), (0x06, 1, 1), (0x07, 1, 1), (0x09, 1, 1), (0x0A, 1, 1),
    (0x0B, 1, 1), (0x0C, 1, 1), (0x0D, 1, 1), (0x0E, 1, 1), (0x0F, 1, 1), (0x16, 1, 1), (0x17, 1, 1),
    (0x18, 1, 1), (0x19, 1, 1), (0x1C, 1, 1), (0x1D, 1, 1), (0x1E, 1, 1), (0x1F, 1, 1),
)  # fmt: skip
_OFFSET_KINDS = {1: "first", 2: "last", 3: "next", 4: "offset", 5: "timestamp"}
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class Subscription:
    __slots__ = ("connection", "credit", "filter", "id", "position", "queue", "send_limit")

    def __init__(
        self, connection: StreamCommands, sub_id: int, queue: StreamQueue, position: int, credit: int, wanted: ConsumerFilter | None
    ):
        self.connection = connection
        self.id = sub_id
        self.queue = queue
        self.position = position
        self.credit = credit
        # RabbitMQ sends nothing while the credit is at most half what the subscription started with.
        self.send_limit = credit // 2
        self.filter = wanted

    def wake(self) -> None:
        try:
            self.connection.deliver(self)
        except Exception:  # woken by a write on another connection: a failure here must cost this one alone
            log.exception("embedded broker: delivering to stream subscription %d failed", self.id)
            self.connection.drop()


class StreamCommands(StreamPublishers, StreamSuper):
    """Mixed into ``StreamConnection``."""

    state: str

    if TYPE_CHECKING:  # provided by StreamConnection

        def write(self, data: bytes) -> None: ...
        def on_close(self, correlation: int) -> None: ...
        def reauthenticate(self, r: Reader, _version: int) -> None: ...
        def drop(self) -> None: ...

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.subscriptions: dict[int, Subscription] = {}
        self.publishers: dict[int, Publisher] = {}
        self.leaders: dict[str, StreamQueue] = {}  # streams whose leader the connection looked up (RabbitMQ caches them)
        self.deliver_version = 1

    def command_handlers(self) -> dict[int, Handler]:
        return {
            Key.DECLARE_PUBLISHER: self._declare_publisher,
            Key.PUBLISH: self._publish,
            Key.QUERY_PUBLISHER_SEQUENCE: self._query_publisher_sequence,
            Key.DELETE_PUBLISHER: self._delete_publisher,
            Key.SUBSCRIBE: self._subscribe,
            Key.CREDIT: self._credit,
            Key.STORE_OFFSET: self._store_offset,
            Key.QUERY_OFFSET: self._query_offset,
            Key.UNSUBSCRIBE: self._unsubscribe,
            Key.CREATE: self._create,
            Key.DELETE: self._delete,
            Key.METADATA: self._metadata,
            Key.SASL_AUTHENTICATE: self.reauthenticate,
            Key.CLOSE: lambda r, _v: self.on_close(r.u32()),
            Key.ROUTE: self.route,
            Key.PARTITIONS: self.partitions,
            Key.EXCHANGE_COMMAND_VERSIONS: self._exchange_command_versions,
            Key.STREAM_STATS: self._stream_stats,
            Key.CONSUMER_UPDATE | 0x8000: lambda _r, _v: None,  # only single active consumers are asked
            0x1D: self.create_super_stream,
            0x1E: self.delete_super_stream,
            0x1F: self._resolve_offset_spec,
        }

    @staticmethod
    def version_known(key: int, version: int) -> bool:
        return version in (1, 2) if key == Key.PUBLISH else version == 1

    # -- streams ---------------------------------------------------------------------

    def stream(self, name: str) -> StreamQueue | None:
        queue = self.server.vhost.queues.get(name)
        return cast(StreamQueue, queue) if queue is not None and queue.is_stream else None

    def _leader(self, name: str) -> StreamQueue | None:
        """The stream as RabbitMQ's lookup_leader finds it: remembered, and watched from then on."""
        queue = self.leaders.get(name)
        if queue is None or queue.deleted:
            queue = self.stream(name)
            if queue is None:
                return None
            self.leaders[name] = queue
            queue.watchers.add(self)
        return queue

    def _forget_leader(self, queue: StreamQueue) -> None:
        """RabbitMQ forgets a stream's leader when a publisher or subscription on it goes, and stops
        watching the stream once nothing of the connection is left on it."""
        if self.leaders.get(queue.name) is queue:
            del self.leaders[queue.name]
        if not any(p.queue is queue for p in self.publishers.values()) and not any(s.queue is queue for s in self.subscriptions.values()):
            queue.watchers.discard(self)

    def stream_gone(self, queue: StreamQueue) -> None:
        cleaned = False
        for sub_id, sub in list(self.subscriptions.items()):
            if sub.queue is queue:
                del self.subscriptions[sub_id]
                cleaned = True
        for pub_id, pub in list(self.publishers.items()):
            if pub.queue is queue:
                del self.publishers[pub_id]
                cleaned = True
        if self.leaders.get(queue.name) is queue:
            del self.leaders[queue.name]
            cleaned = True
        if cleaned:
            self.write(frame(Key.METADATA_UPDATE, 1, _U16.pack(STREAM_NOT_AVAILABLE) + string(queue.name)))

    def forget_streams(self) -> None:
        """The connection is gone: its subscriptions stop and it watches nothing."""
        for sub in self.subscriptions.values():
            if sub in sub.queue.readers:
                sub.queue.readers.remove(sub)
        for queue in {
            *(s.queue for s in self.subscriptions.values()),
            *(p.queue for p in self.publishers.values()),
            *self.leaders.values(),
        }:
            queue.watchers.discard(self)
        self.subscriptions.clear()
        self.publishers.clear()
        self.leaders.clear()

    def _create(self, r: Reader, _version: int) -> None:
        correlation, name, given = r.u32(), r.text(), r.map()
        self.write(response(Key.CREATE, correlation, self.create_stream(name, given)))

    def _delete(self, r: Reader, _version: int) -> None:
        correlation, name = r.u32(), r.text()
        queue = self.stream(name)
        if queue is None:
            self.write(response(Key.DELETE, correlation, STREAM_DOES_NOT_EXIST))
            return
        # Answered first: the metadata update this connection may get follows the answer, as on RabbitMQ.
        self.write(response(Key.DELETE, correlation, OK))
        self.server.vhost.remove_queue(cast("Queue", queue))

    def _metadata(self, r: Reader, _version: int) -> None:
        correlation = r.u32()
        names = [r.text() for _ in range(r.count())]
        found = {name: self.stream(name) is not None for name in names}
        brokers = b""
        if any(found.values()):  # the one node, leader of every stream
            brokers = _U16.pack(0) + string(self.server.advertised_host) + struct.pack(">I", self.server.stream_port)
        body = struct.pack(">i", 1 if brokers else 0) + brokers + struct.pack(">i", len(found))
        for name, exists in found.items():
            leader, code = (0, OK) if exists else (0xFFFF, STREAM_DOES_NOT_EXIST)
            body += string(name) + _U16.pack(code) + _U16.pack(leader) + struct.pack(">i", 0)
        # The one response without a code of its own.
        self.write(struct.pack(">IHHI", 8 + len(body), Key.METADATA | 0x8000, 1, correlation) + body)

    def _stream_stats(self, r: Reader, _version: int) -> None:
        correlation, name = r.u32(), r.text()
        queue = self.stream(name)
        if queue is None:
            self.write(response(Key.STREAM_STATS, correlation, STREAM_DOES_NOT_EXIST, struct.pack(">i", 0)))
            return
        stats = queue.stats()
        body = struct.pack(">i", len(stats)) + b"".join(string(k) + _I64.pack(v) for k, v in stats.items())
        self.write(response(Key.STREAM_STATS, correlation, OK, body))

    def _exchange_command_versions(self, r: Reader, _version: int) -> None:
        correlation = r.u32()
        for _ in range(r.count()):
            key, _low, high = r.u16(), r.u16(), r.u16()
            if key == Key.DELIVER and high >= 2:
                self.deliver_version = 2  # deliveries then carry the committed chunk id
        body = struct.pack(">i", len(COMMAND_VERSIONS)) + b"".join(struct.pack(">HHH", *v) for v in COMMAND_VERSIONS)
        self.write(response(Key.EXCHANGE_COMMAND_VERSIONS, correlation, OK, body))

    # -- offsets ----------------------------------------------------------------------------

    def _store_offset(self, r: Reader, _version: int) -> None:
        reference, name, offset = r.text(), r.text(), r.u64()
        if len(reference.encode()) > MAX_REFERENCE:
            return  # RabbitMQ logs it and carries on: store_offset has no answer
        queue = self._leader(name)
        if queue is not None:
            queue.store_offset(reference, offset)

    def _query_offset(self, r: Reader, _version: int) -> None:
        correlation, reference, name = r.u32(), r.text(), r.text()
        queue = self._leader(name)
        if queue is None:
            self.write(response(Key.QUERY_OFFSET, correlation, STREAM_DOES_NOT_EXIST, _U64.pack(0)))
            return
        offset = queue.tracked_offsets.get(reference)
        self.write(response(Key.QUERY_OFFSET, correlation, OK if offset is not None else NO_OFFSET, _U64.pack(offset or 0)))

    def _resolve_offset_spec(self, r: Reader, _version: int) -> None:
        correlation, name, kind, value = r.u32(), r.text(), *_offset_spec(r)
        queue = self.stream(name)
        if queue is None:
            self.write(response(0x1F, correlation, STREAM_DOES_NOT_EXIST, _U16.pack(4) + _U64.pack(0)))
            return
        # Where a reader would start: the first offset of the chunk it would get first.
        start = queue.reader_start(kind, value)
        chunk, _ = queue.chunk_from(start, None)
        self.write(response(0x1F, correlation, OK, _U16.pack(4) + _U64.pack(start if chunk is None else chunk.first)))

    # -- reading --------------------------------------------------------------------------

    def _subscribe(self, r: Reader, _version: int) -> None:
        correlation, sub_id, name = r.u32(), r.u8(), r.text()
        kind, value = _offset_spec(r)
        credit = r.u16()
        properties = r.map() if not r.at_end else {}
        queue = self.stream(name)
        code = OK
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS or len(properties.get("name", "").encode()) > MAX_REFERENCE:
            code = PRECONDITION_FAILED
        elif queue is None:
            code = STREAM_DOES_NOT_EXIST
        elif sub_id in self.subscriptions:
            code = SUBSCRIPTION_EXISTS
        elif properties.get("single-active-consumer") == "true":
            code = PRECONDITION_FAILED  # single active consumers are not modelled
        self.write(response(Key.SUBSCRIBE, correlation, code))
        if code != OK or queue is None:
            return
        sub = Subscription(self, sub_id, queue, queue.reader_start(kind, value), credit, protocol_filter(properties))
        self.subscriptions[sub_id] = sub
        queue.readers.append(sub)
        queue.watchers.add(self)
        self.deliver(sub)

    def _credit(self, r: Reader, _version: int) -> None:
        sub_id, credit = r.u8(), struct.unpack(">h", r.raw(2))[0]
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            # The one answer without a correlation id: code, then the subscription.
            self.write(frame(Key.CREDIT | 0x8000, 1, _U16.pack(NO_SUBSCRIPTION) + bytes([sub_id])))
            return
        sub.credit += credit
        self.deliver(sub)

    def _unsubscribe(self, r: Reader, _version: int) -> None:
        correlation, sub_id = r.u32(), r.u8()
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            self.write(response(Key.UNSUBSCRIBE, correlation, NO_SUBSCRIPTION))
            return
        if sub in sub.queue.readers:
            sub.queue.readers.remove(sub)
        self._forget_leader(sub.queue)
        self.write(response(Key.UNSUBSCRIBE, correlation, OK))

    def deliver(self, sub: Subscription) -> None:
        """Whole chunks, one per credit, from the chunk holding the subscription's position."""
        if sub.credit <= sub.send_limit or self.subscriptions.get(sub.id) is not sub or self.state != "open":
            return
        queue = sub.queue
        while sub.credit > 0:
            chunk, sub.position = queue.chunk_from(sub.position, sub.filter)
            if chunk is None:
                return
            head = struct.pack(">Bq", sub.id, queue.last_chunk_id) if self.deliver_version == 2 else bytes([sub.id])
            self.write(frame(Key.DELIVER, self.deliver_version, head + chunk.osiris()))
            sub.position = chunk.next
            sub.credit -= 1


def _offset_spec(r: Reader) -> tuple[str, int]:
    kind = _OFFSET_KINDS.get(r.u16())
    if kind is None:
        raise DecodeError("unknown offset specification")
    if kind == "offset":
        return kind, r.u64()
    if kind == "timestamp":
        return kind, r.i64()
    return kind, 0


__all__ = ["Handler", "StreamCommands", "Subscription"]
