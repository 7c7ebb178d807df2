"""Rows to AMQP 1.0 messages: the sections RabbitMQ would hold for the same row published by the AMQP sink over
AMQP 0-9-1 (``Amqp10Encoder``, which the stream-protocol sink's ``StreamMessageBuilder`` builds on; the mapping
is in its docstring), and the messages the sink publishes over AMQP 1.0 (``Amqp10MessageBuilder``): each with its
address in the ``to`` property, for a sender link without a target of its own.

Addresses: on RabbitMQ, its address format v2 (``/exchanges/<exchange>/<routing key>``, ``/queues/<queue>`` for
the default exchange, every part percent-encoded); elsewhere (ActiveMQ Artemis), the routing key for the default
exchange (a queue) and the exchange's name otherwise (a topic), each an address of that broker.
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
from ..stream_protocol.rows import STANDARD, Conversion
from .columns import MessageBuilder
from .core_records import amqp10_records
from .options import SinkOptions

__all__ = ["PREFIX_CACHE", "Amqp10Encoder", "Amqp10Message", "Amqp10MessageBuilder", "address_of", "hashable"]

_LONG = struct.Struct(">q")
_UINT = struct.Struct(">I")
_MAX_UINT = (1 << 32) - 1
PREFIX_CACHE = 1024  # distinct encoded property sets kept (rows with a message_id each never repeat one)
_DATA_SMALL = b"\x00\x53\x75\xa0"  # a data section holding up to 255 bytes, then its one-byte size
_DATA_LARGE = b"\x00\x53\x75\xb0"  # a larger one: a four-byte size
_EMPTY_DATA = _DATA_SMALL + b"\x00"


class Amqp10Encoder(MessageBuilder):
    """A row's AMQP 1.0 sections, as RabbitMQ converts the AMQP sink's publish of it (``conversion``)."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        self.conversion = Conversion.of(None)
        self._prefixes: dict[tuple[Any, ...], bytes] = {}

    def record(self, prefix: bytes, body: bytes) -> bytes:
        """The whole message: ``prefix`` (its sections before the body), then ``body`` as one data section."""
        size = len(body)
        return prefix + (_DATA_SMALL + bytes((size,)) if size < 256 else _DATA_LARGE + _UINT.pack(size)) + body

    def cached_prefix(
        self, row: dict[str, Any], i: int, exchange: str | None, key: str | None, filter_value: str | None, to: str | None
    ) -> bytes:
        """``_prefix``, encoded once for each distinct set of values (and checked then)."""
        cache_key = (exchange, key, filter_value, to, *[(c, hashable(v)) for c, v in row.items()])
        prefix = self._prefixes.get(cache_key)
        if prefix is None:
            if len(self._prefixes) >= PREFIX_CACHE:
                self._prefixes.clear()
            prefix = self._prefixes[cache_key] = self._prefix(self._checked(row, i), exchange, key, filter_value, to)
        return prefix

    def _prefix(
        self, props: dict[str, Any], exchange: str | None, key: str | None, filter_value: str | None, to: str | None = None
    ) -> bytes:
        """The message's sections before its body. ``to``: the address it is published to (the ``to`` property);
        without it, the routing annotations a message routed by ``exchange`` with ``key`` carries in a stream."""
        conv = self.conversion
        annotations: dict[Any, Any] = {}
        if to is None and exchange is not None:
            annotations[Symbol("x-exchange")] = exchange
        if to is None and key is not None:
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
        properties[2] = to
        properties[4] = reply_to
        encoded = amqp10.encode(b"", header=header, annotations=annotations, properties=properties, application_properties=apps)
        return encoded[: -len(_EMPTY_DATA)]

    def _checked(self, row: dict[str, Any], i: int) -> dict[str, Any]:
        checked = super()._checked(row, i)
        expiration = checked.get("expiration")
        if expiration is not None and int(expiration) > _MAX_UINT and not self.conversion.legacy:
            raise self._bad("expiration", i, expiration, f"an AMQP 1.0 ttl is at most {_MAX_UINT} milliseconds")
        return checked


class Amqp10Message(NamedTuple):
    address: str  # where it goes: its ``to``
    record: bytes  # the encoded message
    to_queue: bool  # through the default exchange: to the queue its routing key names


class Amqp10MessageBuilder(Amqp10Encoder):
    """Arrow batches to the messages the sink publishes over AMQP 1.0; a bad value fails the batch before any of it goes."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        self.rabbitmq = True
        self._addresses: dict[tuple[str, str], str] = {}
        self._plain: dict[str, bytes] = {}  # address -> the prefix of a row with no property (and no filter value)

    def met_amqp10_broker(self, version: tuple[int, int] | None, rabbitmq: bool, max_frame: int) -> None:
        self.met(version)
        self._prefixes.clear()
        self._addresses.clear()
        self._plain.clear()
        self.conversion = Conversion.of(version) if rabbitmq else STANDARD
        self.rabbitmq = rabbitmq

    def amqp10_messages(self, batch: pa.RecordBatch) -> list[Amqp10Message]:
        columns = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        bodies = self._bodies(columns)
        keys = self._names(columns.get("routing_key"), n, self.default_key or "", "routing_key")
        exchanges = self._names(columns.get("exchange"), n, None, "exchange")
        filters = columns[self.filter_column].to_pylist() if self.filter_column in columns else [None] * n
        default = self.options.exchange
        addresses, plain = self._addresses, self._plain
        if len(addresses) > PREFIX_CACHE:
            addresses.clear()
            plain.clear()
        tos, to_queue = [], []
        for i in range(n):
            exchange = default if exchanges[i] is None else exchanges[i]
            route = (exchange, keys[i])
            to = addresses.get(route)
            if to is None:
                to = addresses[route] = address_of(exchange, keys[i], self.rabbitmq)
            tos.append(to)
            to_queue.append(exchange == "")
        records = amqp10_records(columns, bodies, self.conversion, self.options.persistent, filters=filters, tos=tos)
        if records is None:
            records = []
            rows = self._raw_properties(columns, n, always=True) or []
            for i, to in enumerate(tos):
                row = rows[i]
                if row or filters[i] is not None:
                    prefix = self.cached_prefix(row, i, None, None, filters[i], to)
                else:  # no cache key to build
                    prefix = plain.get(to) or plain.setdefault(to, self.cached_prefix(row, i, None, None, None, to))
                records.append(self.record(prefix, bodies[i]))
        self.position += n
        return [Amqp10Message(to, record, queue) for to, record, queue in zip(tos, records, to_queue, strict=True)]


def address_of(exchange: str, key: str, rabbitmq: bool) -> str:
    """Where a message published to ``exchange`` with routing key ``key`` goes, as an AMQP 1.0 address."""
    if not rabbitmq:
        return key if exchange == "" else exchange
    quoted = urllib.parse.quote(key, safe="")
    if exchange == "":
        return f"/queues/{quoted}"
    return f"/exchanges/{urllib.parse.quote(exchange, safe='')}" + (f"/{quoted}" if key else "")


def hashable(value: Any) -> Any:
    """A column value as a cache key: headers (Arrow's (key, value) pairs, or a row's dict) as a tuple."""
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, hashable(v)) for k, v in value.items())
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
