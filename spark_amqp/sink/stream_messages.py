"""Rows to AMQP 1.0 messages for the stream-protocol sink: the columns the AMQP sink writes, as RabbitMQ stores them.

RabbitMQ keeps every stream message as AMQP 1.0 and converts a message published over AMQP 0-9-1
to it, differently by line. This builder writes what the broker would have written for the same
row published by the AMQP sink, so that the source (over either protocol, ``stream_protocol/rows.py``)
and any AMQP 0-9-1 consumer read the row back with the same columns:

- body: one data section; ``message_id``, ``correlation_id``, ``user_id`` (binary), ``reply_to``,
  ``content_type``, ``content_encoding`` (symbols) and ``timestamp`` (``creation-time``, ms): the
  properties section;
- ``headers``: application properties (integers as AMQP longs; 3.10 refuses unsigned ones);
- ``exchange`` / ``routing_key`` (column, else option ``routingKey``): the ``x-exchange`` /
  ``x-routing-key`` annotations a message routed through that exchange with that key carries;
  without them a reader shows the stream's own name as the routing key, as for the AMQP sink's
  publishes through the default exchange;
- 4.x: ``priority``, ``delivery_mode`` (``durable``) and ``expiration`` (``ttl``) in the header
  section, ``type`` as the ``x-basic-type`` annotation, ``app_id`` as ``group-id``; 4.3 writes
  ``reply_to`` as a ``/queues/<name>`` address;
- 3.x: no header section (3.10 cannot convert one for AMQP 0-9-1 readers: 541), but ``x-basic-*``
  annotations for ``priority``, ``delivery_mode`` and ``expiration``, and ``x-basic-type`` /
  ``x-basic-app-id`` application properties;
- the filter value column: the publish frame's filter value (RabbitMQ 3.13+), and in the message
  ``x-stream-filter-value`` as RabbitMQ keeps the AMQP 0-9-1 header of that name (a 4.x
  annotation, a 3.x application property), so that the source's row filter sees it.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from ..stream_protocol.rows import Conversion
from .amqp10_messages import Amqp10Encoder
from .columns import PUBLISHING_ID
from .core_records import amqp10_records
from .options import SinkOptions
from .producers import Producer

__all__ = ["MESSAGE_OVERHEAD", "StreamMessage", "StreamMessageBuilder"]

# A publish frame around one message: size, key, version, publisher id, count (4+2+2+1+4), then the
# message's publishing id, filter value (2 + its bytes) and size (8+2+4).
MESSAGE_OVERHEAD = 27


class StreamMessage(NamedTuple):
    target: int  # the index of the stream it goes to in ``StreamMessageBuilder.targets``
    publishing_id: int
    filter_value: str | None
    record: bytes  # the encoded AMQP 1.0 message, or a whole sub-entry (``sub_entry``)
    messages: int = 1  # a sub-entry holds several, under its last one's publishing id
    sub_entry: bool = False


class StreamMessageBuilder(Amqp10Encoder):
    """Arrow batches to ``StreamMessage``s; a bad value fails the batch before any of it is published."""

    def __init__(self, options: SinkOptions, producer: Producer) -> None:
        super().__init__(options)
        self.producer = producer
        self.targets: tuple[str, ...] = (options.stream,) if options.stream is not None else ()
        self.max_record = 1 << 30  # until the broker's frame size is known
        self.filtering = True  # publish v2 frames carry filter values (RabbitMQ 3.13+)
        self.last_id = -1  # the last own publishing id: they must increase
        if options.max_message_size is None:
            self.max_message_size = 1 << 30  # the frame size limits the whole message (``met``)

    def met_stream_broker(self, version: tuple[int, int] | None, frame_max: int) -> None:
        """The broker answered: its line decides the conversion, its frame size the largest message."""
        self._prefixes.clear()
        self.conversion = Conversion.of(version)
        self.filtering = version is None or version >= (3, 13)
        self.max_record = frame_max - MESSAGE_OVERHEAD

    def route_to(self, partitions: tuple[str, ...]) -> None:
        super().route_to(partitions)
        self.targets = partitions

    def stream_messages(self, batch: pa.RecordBatch) -> list[StreamMessage]:
        columns = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        bodies = self._bodies(columns)
        targets = self._partition_indexes(columns, n) if self.options.super_stream else [0] * n
        keys = self._names(columns.get("routing_key"), n, self.default_key, "routing_key")
        exchanges = self._names(columns.get("exchange"), n, None, "exchange")
        filters = columns[self.filter_column].to_pylist() if self.filter_column in columns else [None] * n
        if self.options.sub_entry_size > 1 and any(v is not None for v in filters):
            first = next(i for i, v in enumerate(filters) if v is not None)
            raise self._bad(
                self.filter_column,
                first,
                filters[first],
                "a stream keeps filter values per message, and option 'subEntrySize' puts several messages in one entry "
                "(RabbitMQ's clients do not filter sub-entries either): drop the column, or publish without subEntrySize",
            )
        ids = (
            self._own_ids(columns[PUBLISHING_ID])
            if PUBLISHING_ID in columns
            else [self.producer.id_of(self.position + i) for i in range(n)]
        )
        records = amqp10_records(columns, bodies, self.conversion, self.options.persistent, exchanges=exchanges, keys=keys, filters=filters)
        if records is None:
            rows = self._raw_properties(columns, n, always=True) or []
            records = [self.record(self.cached_prefix(rows[i], i, exchanges[i], keys[i], filters[i], None), bodies[i]) for i in range(n)]
        out = []
        for i, record in enumerate(records):
            if len(record) + len((filters[i] or "").encode("utf-8")) > self.max_record:
                raise self._bad(
                    "body",
                    i,
                    bodies[i],
                    f"the message is {len(record)} bytes with its properties, more than a stream protocol frame holds "
                    f"({self.max_record} bytes, the broker's frame_max less the frame's own fields)",
                )
            out.append(StreamMessage(targets[i], ids[i], filters[i] if self.filtering else None, record))
        self.position += n
        return out

    def _own_ids(self, column: pa.Array) -> list[int]:
        """The ``publishing_id`` column: never null or negative, and increasing down the partition."""
        ids: list[int] = column.to_pylist()
        last = self.last_id
        for i, value in enumerate(ids):
            if value is None or value < 0 or value <= last:
                why = (
                    "a publishing id must be a number from 0 up"
                    if value is None or value < 0
                    else f"publishing ids must increase down the partition (the row before had {last}); the broker "
                    "would drop this row as a duplicate"
                )
                raise self._bad(PUBLISHING_ID, i, value, why)
            last = value
        self.last_id = last
        return ids
