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

import datetime
import decimal
import struct
import urllib.parse
from typing import Any, NamedTuple

import pyarrow as pa

from .. import amqp10
from ..amqp10.types import Opaque, Symbol, Timestamp
from ..rabbitmq import FILTER_VALUE_HEADER
from ..stream_protocol.rows import Conversion
from .columns import PUBLISHING_ID, MessageBuilder
from .options import SinkOptions
from .producers import Producer

__all__ = ["MESSAGE_OVERHEAD", "StreamMessage", "StreamMessageBuilder"]

# A publish frame around one message: size, key, version, publisher id, count (4+2+2+1+4), then the
# message's publishing id, filter value (2 + its bytes) and size (8+2+4).
MESSAGE_OVERHEAD = 27
_LONG = struct.Struct(">q")
_UINT = struct.Struct(">I")
_MAX_UINT = (1 << 32) - 1
PREFIX_CACHE = 1024  # distinct encoded property sets kept (rows with a message_id each never repeat one)
_DATA_SMALL = b"\x00\x53\x75\xa0"  # a data section holding up to 255 bytes, then its one-byte size
_DATA_LARGE = b"\x00\x53\x75\xb0"  # a larger one: a four-byte size
_EMPTY_DATA = _DATA_SMALL + b"\x00"


class StreamMessage(NamedTuple):
    target: int  # the index of the stream it goes to in ``StreamMessageBuilder.targets``
    publishing_id: int
    filter_value: str | None
    record: bytes  # the encoded AMQP 1.0 message, or a whole sub-entry (``sub_entry``)
    messages: int = 1  # a sub-entry holds several, under its last one's publishing id
    sub_entry: bool = False


class StreamMessageBuilder(MessageBuilder):
    """Arrow batches to ``StreamMessage``s; a bad value fails the batch before any of it is published."""

    def __init__(self, options: SinkOptions, producer: Producer) -> None:
        super().__init__(options)
        self.producer = producer
        self.conversion = Conversion.of(None)
        self.targets: tuple[str, ...] = (options.stream,) if options.stream is not None else ()
        self.max_record = 1 << 30  # until the broker's frame size is known
        self.filtering = True  # publish v2 frames carry filter values (RabbitMQ 3.13+)
        self.last_id = -1  # the last own publishing id: they must increase
        self._prefixes: dict[tuple[Any, ...], bytes] = {}
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
        rows = self._raw_properties(columns, n, always=True) or []
        out = []
        prefixes = self._prefixes
        for i in range(n):
            row = rows[i]
            # The sections before the body, encoded once for each distinct set of values (and checked then).
            cache_key = (exchanges[i], keys[i], filters[i], *[(c, _hashable(v)) for c, v in row.items()])
            prefix = prefixes.get(cache_key)
            if prefix is None:
                if len(prefixes) >= PREFIX_CACHE:
                    prefixes.clear()
                prefix = prefixes[cache_key] = self._prefix(self._checked(row, i), exchanges[i], keys[i], filters[i])
            body = bodies[i]
            size = len(body)
            record = prefix + (_DATA_SMALL + bytes((size,)) if size < 256 else _DATA_LARGE + _UINT.pack(size)) + body
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

    def _prefix(self, props: dict[str, Any], exchange: str | None, key: str | None, filter_value: str | None) -> bytes:
        """The message's sections before its body."""
        conv = self.conversion
        annotations: dict[Any, Any] = {}
        if exchange is not None:
            annotations[Symbol("x-exchange")] = exchange
        if key is not None:
            annotations[Symbol("x-routing-key")] = key
        apps = {k: _app_value(v) for k, v in (props.get("headers") or {}).items()}
        if filter_value is not None:
            if conv.legacy:
                apps[FILTER_VALUE_HEADER] = filter_value
            else:
                annotations[Symbol(FILTER_VALUE_HEADER)] = filter_value
        mode = props.get("delivery_mode", 2 if self.options.persistent else None)
        priority = props.get("priority")
        expiration = props.get("expiration")
        header: list[Any] = []
        properties: list[Any] = [None] * 13
        properties[0] = props.get("message_id")
        properties[1] = props["user_id"].encode("utf-8") if "user_id" in props else None
        properties[5] = props.get("correlation_id")
        for index, name in ((6, "content_type"), (7, "content_encoding")):
            if name in props:
                properties[index] = Symbol(props[name])
        if "timestamp" in props:
            properties[9] = Timestamp(int(props["timestamp"].timestamp()) * 1000)
        reply_to = props.get("reply_to")
        if conv.legacy:
            for name, value in (("x-basic-priority", priority), ("x-basic-delivery-mode", mode)):
                if value is not None:
                    annotations[Symbol(name)] = Opaque(0x50, bytes((value,)))
            if expiration is not None:
                annotations[Symbol("x-basic-expiration")] = expiration
            for name, column in (("x-basic-type", "type"), ("x-basic-app-id", "app_id")):
                if column in props:
                    apps[name] = props[column]
        else:
            if mode is not None or priority is not None or expiration is not None:
                header = [
                    None if mode is None else mode == 2,
                    None if priority is None else Opaque(0x50, bytes((priority,))),
                    None if expiration is None else Opaque(0x70, _UINT.pack(int(expiration))),
                ]
            if "type" in props:
                annotations[Symbol("x-basic-type")] = props["type"]
            properties[10] = props.get("app_id")
            if reply_to is not None and conv.address_reply_to:
                reply_to = "/queues/" + urllib.parse.quote(reply_to, safe="")
        properties[4] = reply_to
        encoded = amqp10.encode(b"", header=header, annotations=annotations, properties=properties, application_properties=apps)
        return encoded[: -len(_EMPTY_DATA)]

    def _checked(self, row: dict[str, Any], i: int) -> dict[str, Any]:
        checked = super()._checked(row, i)
        expiration = checked.get("expiration")
        if expiration is not None and int(expiration) > _MAX_UINT and not self.conversion.legacy:
            raise self._bad("expiration", i, expiration, f"an AMQP 1.0 ttl is at most {_MAX_UINT} milliseconds")
        return checked


def _hashable(value: Any) -> Any:
    """A column value as a cache key: headers (Arrow's (key, value) pairs, or a row's dict) as a tuple."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _app_value(value: Any) -> Any:
    """A header value (as ``_property_value`` checked it) as an application property RabbitMQ 3.10 to 4.3 converts."""
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return Opaque(0x81, _LONG.pack(value))  # long: 3.10 refuses an unsigned one (541)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, datetime.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return Timestamp(int(when.timestamp() * 1000))
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)
