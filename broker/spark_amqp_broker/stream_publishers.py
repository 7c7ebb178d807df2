"""Stream-protocol publishers on the embedded broker, answered as RabbitMQ 4.3 answers them.

A publisher writes to one stream. Its publishes are confirmed once their chunk is written
(later on the same event-loop pass). With a reference (a producer name) the stream keeps
the highest publishing id per reference and drops a message whose id is not above it,
confirming it all the same: osiris' deduplication, which lasts as long as the stream, across
connections. A sub-entry is stored whole, as it came, whatever its codec (``stream_records.SubEntry``),
under its one publishing id; one that declares more than 64 MiB uncompressed is refused, precondition
failed, as RabbitMQ 4.3 refuses it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from spark_amqp.stream_protocol.compression import MAX_UNCOMPRESSED, SUB_ENTRY
from spark_amqp.stream_protocol.wire import OK, Key, Reader, frame, response

from .stream_records import NativeRecord, SubEntry

if TYPE_CHECKING:
    from .server import BrokerServer
    from .stream import StreamQueue

STREAM_DOES_NOT_EXIST, STREAM_NOT_AVAILABLE, PRECONDITION_FAILED, NO_PUBLISHER = 0x02, 0x06, 0x11, 0x12
MAX_PUBLISHERS = 255  # per connection
MAX_REFERENCE = 255  # bytes
_U64 = struct.Struct(">Q")


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
            self._publish_errors(pub_id, [(pid, NO_PUBLISHER) for pid, _ in entries])
            return
        queue, reference = publisher.queue, publisher.reference
        now = self.server.loop.time()
        confirmed: list[int] = []
        rejected: list[tuple[int, int]] = []
        for publishing_id, records in entries:
            if records is None or rejected:  # RabbitMQ refuses the rest of the frame too: no gap in the ids
                rejected.append((publishing_id, PRECONDITION_FAILED))
                continue
            confirmed.append(publishing_id)
            if reference is not None:
                if publishing_id <= queue.writer_sequences.get(reference, -1):
                    continue  # a duplicate: not stored, confirmed all the same
                queue.writer_sequences[reference] = publishing_id
            queue.publish_together(records, now, reference)
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


def _publish_entries(r: Reader, count: int, version: int) -> list[tuple[int, list[NativeRecord] | None]]:
    """(publishing id, records) of each entry; None for a sub-entry the broker refuses (declaring over 64 MiB
    uncompressed, or an uncompressed one whose records do not add up)."""
    out: list[tuple[int, list[NativeRecord] | None]] = []
    for _ in range(count):
        publishing_id = r.u64()
        filter_value = r.string() if version == 2 else None
        word = r.u32()
        if not word & 0x80000000:
            out.append((publishing_id, [NativeRecord(r.raw(word), filter_value)]))
            continue
        r.pos -= 4
        head = r.raw(SUB_ENTRY.size)
        kind, records, uncompressed, size = SUB_ENTRY.unpack(head)
        entry = SubEntry(head + r.raw(size), records, compressed=(kind >> 4) & 0x7 != 0)
        if uncompressed > MAX_UNCOMPRESSED:
            out.append((publishing_id, None))
        elif entry.compressed:
            out.append((publishing_id, [NativeRecord(b"", filter_value, entry) for _ in range(records)]))
        else:
            out.append((publishing_id, _plain_records(entry, filter_value)))
    return out


def _plain_records(entry: SubEntry, filter_value: str | None) -> list[NativeRecord] | None:
    """An uncompressed sub-entry's records (AMQP 0-9-1 readers get them), or None if they do not add up."""
    body, at, out = entry.wire, SUB_ENTRY.size, []
    try:
        for _ in range(entry.records):
            (length,) = struct.unpack_from(">I", body, at)
            if at + 4 + length > len(body):
                return None
            out.append(NativeRecord(body[at + 4 : at + 4 + length], filter_value, entry))
            at += 4 + length
    except struct.error:
        return None
    return out
