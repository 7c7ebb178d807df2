"""Stream-protocol publishers on the embedded broker, answered as RabbitMQ 4.3 answers them.

A publisher writes to one stream. Its publishes are confirmed once their chunk is written
(later on the same event-loop pass). With a reference (a producer name) the stream keeps
the highest publishing id per reference and drops a message whose id is not above it,
confirming it all the same: osiris' deduplication, which lasts as long as the stream, across
connections. A sub-batch is stored as its messages (uncompressed or gzip; the other
compressions are refused, precondition failed, where RabbitMQ would store them whole).
"""

from __future__ import annotations

import gzip
import struct
from typing import TYPE_CHECKING

from ..stream_protocol.wire import OK, Key, Reader, frame, response
from .stream_records import NativeRecord

if TYPE_CHECKING:
    from .server import BrokerServer
    from .stream import StreamQueue

STREAM_DOES_NOT_EXIST, STREAM_NOT_AVAILABLE, PRECONDITION_FAILED, NO_PUBLISHER = 0x02, 0x06, 0x11, 0x12
MAX_PUBLISHERS = 255  # per connection
MAX_REFERENCE = 255  # bytes
_U64 = struct.Struct(">Q")
_SUB_BATCH = struct.Struct(">BHII")


class Publisher:
    __slots__ = ("id", "queue", "reference")

    def __init__(self, pub_id: int, queue: StreamQueue, reference: str | None) -> None:
        self.id = pub_id
        self.queue = queue
        self.reference = reference


class StreamPublishers:
    """Mixed into ``StreamCommands``."""

    server: BrokerServer
    publishers: dict[int, Publisher]

    if TYPE_CHECKING:

        def write(self, data: bytes) -> None: ...
        def stream(self, name: str) -> StreamQueue | None: ...
        def _leader(self, name: str) -> StreamQueue | None: ...
        def _forget_leader(self, queue: StreamQueue) -> None: ...

    def _declare_publisher(self, r: Reader, _version: int) -> None:
        correlation, pub_id, reference, name = r.u32(), r.u8(), r.text(), r.text()
        taken = pub_id in self.publishers or any(p.reference == reference != "" and p.queue.name == name for p in self.publishers.values())
        code = OK
        if len(self.publishers) >= MAX_PUBLISHERS or len(reference.encode()) > MAX_REFERENCE or taken:
            code = PRECONDITION_FAILED
        else:
            queue = self._leader(name)
            if queue is None:
                code = STREAM_DOES_NOT_EXIST
            elif self.server.faults.take("leader_down"):
                code = STREAM_NOT_AVAILABLE
            else:
                self.publishers[pub_id] = Publisher(pub_id, queue, reference or None)
        self.write(response(Key.DECLARE_PUBLISHER, correlation, code))

    def _publish(self, r: Reader, version: int) -> None:
        pub_id, count = r.u8(), r.count()
        publisher = self.publishers.get(pub_id)
        entries = _publish_entries(r, count, version)
        if publisher is None:
            self._publish_errors(pub_id, [(pid, NO_PUBLISHER) for pid, _, _ in entries])
            return
        queue, reference = publisher.queue, publisher.reference
        now = self.server.loop.time()
        confirmed: list[int] = []
        rejected: list[tuple[int, int]] = []
        for publishing_id, filter_value, records in entries:
            if records is None or rejected:  # RabbitMQ refuses the rest of the frame too: no gap in the ids
                rejected.append((publishing_id, PRECONDITION_FAILED))
                continue
            confirmed.append(publishing_id)
            if reference is not None:
                if publishing_id <= queue.writer_sequences.get(reference, -1):
                    continue  # a duplicate: not stored, confirmed all the same
                queue.writer_sequences[reference] = publishing_id
            for raw in records:
                queue.publish(NativeRecord(raw, filter_value), now, reference)
        if rejected:
            self._publish_errors(pub_id, rejected)
        if confirmed:
            # After the chunk is written: the queue seals it on this same event-loop pass, earlier.
            self.server.loop.call_soon(self._confirm, publisher, confirmed)

    def _confirm(self, publisher: Publisher, ids: list[int]) -> None:
        if self.publishers.get(publisher.id) is publisher and not publisher.queue.deleted:
            body = struct.pack(">Bi", publisher.id, len(ids)) + b"".join(_U64.pack(i) for i in ids)
            self.write(frame(Key.PUBLISH_CONFIRM, 1, body))

    def _publish_errors(self, pub_id: int, errors: list[tuple[int, int]]) -> None:
        body = struct.pack(">Bi", pub_id, len(errors)) + b"".join(struct.pack(">QH", i, code) for i, code in errors)
        self.write(frame(Key.PUBLISH_ERROR, 1, body))

    def _query_publisher_sequence(self, r: Reader, _version: int) -> None:
        correlation, reference, name = r.u32(), r.text(), r.text()
        queue = self.stream(name)
        if queue is None:
            self.write(response(Key.QUERY_PUBLISHER_SEQUENCE, correlation, STREAM_DOES_NOT_EXIST, _U64.pack(0)))
            return
        sequence = max(queue.writer_sequences.get(reference, 0), 0)
        self.write(response(Key.QUERY_PUBLISHER_SEQUENCE, correlation, OK, _U64.pack(sequence)))

    def _delete_publisher(self, r: Reader, _version: int) -> None:
        correlation, pub_id = r.u32(), r.u8()
        publisher = self.publishers.pop(pub_id, None)
        if publisher is None:
            self.write(response(Key.DELETE_PUBLISHER, correlation, NO_PUBLISHER))
            return
        self._forget_leader(publisher.queue)
        self.write(response(Key.DELETE_PUBLISHER, correlation, OK))


def _publish_entries(r: Reader, count: int, version: int) -> list[tuple[int, str | None, list[bytes] | None]]:
    """(publishing id, filter value, records) of each entry; None records for a sub-batch the broker
    cannot store (compressed other than with gzip, or damaged)."""
    out: list[tuple[int, str | None, list[bytes] | None]] = []
    for _ in range(count):
        publishing_id = r.u64()
        filter_value = r.string() if version == 2 else None
        word = r.u32()
        if not word & 0x80000000:
            out.append((publishing_id, filter_value, [r.raw(word)]))
            continue
        r.pos -= 4
        kind, records, _uncompressed, size = _SUB_BATCH.unpack(r.raw(11))
        batch = r.raw(size)
        compression = (kind >> 4) & 0x7
        if compression not in (0, 1):
            out.append((publishing_id, filter_value, None))
            continue
        try:
            body = gzip.decompress(batch) if compression == 1 else batch
            items, at = [], 0
            for _ in range(records):
                (length,) = struct.unpack_from(">I", body, at)
                items.append(body[at + 4 : at + 4 + length])
                at += 4 + length
        except (OSError, EOFError, struct.error):
            out.append((publishing_id, filter_value, None))
            continue
        out.append((publishing_id, filter_value, items))
    return out
