"""What the sink accepts as input columns, and rows to AMQP messages.

Input columns: ``body`` (binary or string, required); optional ``routing_key``,
``exchange``, ``headers`` (a map with string keys), the property columns of
the source schema, ``filter_value`` (or the column option ``filterValueColumn``
names: the message's ``x-stream-filter-value``) and, with ``superStream``,
``partition_key``. Columns only the source produces (``queue``,
``delivery_tag``, ``redelivered``, ``raw_header``, stream mode's ``offset``) are
ignored, so a DataFrame read from a queue or a stream can be written back as it is. Any other column is an error, to catch typos.

The schema is checked on the driver before any task runs; values (null bodies,
routing keys over 255 bytes, oversized messages) are checked for a whole Arrow
batch before any message of that batch is published.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import AmqpOptionError
from ..property_columns import INT_PROPERTIES as INT_PROPERTY_COLUMNS
from ..property_columns import STRING_PROPERTIES as STRING_PROPERTY_COLUMNS
from ..rabbitmq import FILTER_VALUE_HEADER, MAX_MESSAGE_SIZE_3X, MAX_MESSAGE_SIZE_4X
from .basic_properties import field_table, marshal
from .core_records import basic_headers
from .options import SinkOptions
from .routing import partition_of

SOURCE_ONLY_COLUMNS = ("queue", "delivery_tag", "redelivered", "raw_header", "offset")
PUBLISHING_ID = "publishing_id"  # stream protocol: the row's own deduplication id (sink/producers.py)
# Encoded exchange names and routing keys kept between batches. Keys can be unique per row (a
# consistent-hash exchange keyed by order id: 174 MiB per million), so the cache starts over past this.
SHORTSTR_CACHE_MAX = 10_000
ACCEPTED = ("body", "routing_key", "exchange", "headers", *STRING_PROPERTY_COLUMNS, *INT_PROPERTY_COLUMNS, "timestamp")
HEADER_VALUE_TYPES = ("string", "binary", "boolean", "byte", "short", "integer", "long", "float", "double", "timestamp", "decimal")


def accepted(options: SinkOptions) -> tuple[str, ...]:
    routed = ("partition_key",) if options.super_stream else ()
    own_ids = (PUBLISHING_ID,) if options.connection.stream_protocol else ()
    return (*ACCEPTED, options.filter_value_column.lower(), *routed, *own_ids)


def check_schema(schema: Any, options: SinkOptions) -> None:
    """Validate a Spark StructType of the input; raises AmqpOptionError naming the column."""
    fields = {f.name.lower(): f for f in schema.fields}
    if "body" not in fields:
        raise AmqpOptionError(
            f"the DataFrame to write needs a 'body' column (binary or string); it has: {', '.join(f.name for f in schema.fields)}"
        )
    known = accepted(options)
    unknown = [f.name for f in schema.fields if f.name.lower() not in known and f.name.lower() not in SOURCE_ONLY_COLUMNS]
    if unknown:
        hint = " ('partition_key' only with option superStream)" if "partition_key" in fields and not options.super_stream else ""
        raise AmqpOptionError(
            f"unknown column(s) {', '.join(unknown)}; the AMQP sink takes: {', '.join(known)}{hint} (drop or rename the others)"
        )
    if options.super_stream:
        if "exchange" in fields:
            raise AmqpOptionError(
                f"column 'exchange' cannot be used with option superStream: each row goes to the partition of super stream '{options.super_stream}' its key hashes to"
            )
        if "partition_key" not in fields and "routing_key" not in fields and options.routing_key is None:
            raise AmqpOptionError(
                "option superStream routes each row by its key: give a 'partition_key' or 'routing_key' column (or option routingKey, which sends every row to one partition)"
            )

    def kind(name: str) -> str:
        return str(fields[name].dataType.typeName())

    if kind("body") not in ("binary", "string"):
        raise AmqpOptionError(f"column 'body' must be binary or string, not {fields['body'].dataType.simpleString()}")
    for name in ("routing_key", "exchange", "partition_key", options.filter_value_column.lower(), *STRING_PROPERTY_COLUMNS):
        if name in fields and kind(name) != "string":
            raise AmqpOptionError(f"column '{name}' must be a string, not {fields[name].dataType.simpleString()}")
    for name in (*INT_PROPERTY_COLUMNS, PUBLISHING_ID):
        if name in fields and kind(name) not in ("byte", "short", "integer", "long"):
            raise AmqpOptionError(f"column '{name}' must be an integer, not {fields[name].dataType.simpleString()}")
    if PUBLISHING_ID in fields and not options.deduplication:
        raise AmqpOptionError(f"column '{PUBLISHING_ID}' sets the ids the broker deduplicates by: it needs deduplication=true")
    if "timestamp" in fields and kind("timestamp") not in ("timestamp", "timestamp_ntz", "long", "integer"):
        raise AmqpOptionError(f"column 'timestamp' must be a timestamp or epoch seconds, not {fields['timestamp'].dataType.simpleString()}")
    if "headers" in fields:
        dt = fields["headers"].dataType
        if dt.typeName() != "map" or dt.keyType.typeName() != "string":
            raise AmqpOptionError(f"column 'headers' must be a map with string keys, not {dt.simpleString()}")
        if dt.valueType.typeName() not in HEADER_VALUE_TYPES:
            raise AmqpOptionError(
                f"column 'headers' has values of type {dt.valueType.simpleString()}; supported: {', '.join(HEADER_VALUE_TYPES)}"
            )


@dataclass(frozen=True)
class Outgoing:
    exchange: bytes  # encoded shortstr
    routing_key: bytes  # encoded shortstr
    header: bytes  # content header payload
    body: bytes


def _shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


class MessageBuilder:
    """Turns Arrow record batches into messages, validating a whole batch before the first of its messages goes out.

    A bad value fails the task with an error naming the column, the row's
    position in the partition and the value's type, and saying how many rows
    of the partition were already published.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.max_message_size = options.max_message_size or MAX_MESSAGE_SIZE_3X
        self._limit_said = f"maxMessageSize {self.max_message_size}"
        self.default_exchange = _shortstr(options.exchange)
        self.default_key = options.routing_key
        self.position = 0  # rows of this partition in earlier batches (all published)
        self._shortstr_cache: dict[str, bytes] = {}
        self.filter_column = options.filter_value_column.lower()
        self.partitions: tuple[bytes, ...] = ()  # a super stream's partitions (encoded names), once found
        self._routes: dict[str, int] = {}
        self._constant_props = marshal({"delivery_mode": 2 if options.persistent else None})

    def met(self, version: tuple[int, int] | None) -> None:
        """The broker answered: without option maxMessageSize, bodies are held to its line's default."""
        if self.options.max_message_size is None and version is not None and version >= (4, 0):
            self.max_message_size = MAX_MESSAGE_SIZE_4X
            self._limit_said = f"RabbitMQ {version[0]}.{version[1]}'s default max_message_size, {MAX_MESSAGE_SIZE_4X}; set maxMessageSize if the broker's is higher"

    def route_to(self, partitions: tuple[str, ...]) -> None:
        """A super stream's partitions in their order: each row goes to the one its key hashes to."""
        self.partitions = tuple(_shortstr(p) for p in partitions)

    def _routed(self, columns: dict[str, pa.Array], n: int) -> list[bytes]:
        """Per row, the partition (its encoded name: published through the default exchange) its key picks."""
        partitions = self.partitions
        return [partitions[i] for i in self._partition_indexes(columns, n)]

    def _partition_indexes(self, columns: dict[str, pa.Array], n: int) -> list[int]:
        """Per row, the index of the super stream partition its key picks."""
        name = "partition_key" if "partition_key" in columns else "routing_key"
        # A key is only hashed (the row goes out under its partition's name): any length will do.
        keys = self._names(columns.get(name), n, self.default_key, name, shortstr=False)
        routes, count = self._routes, len(self.partitions)
        if len(routes) > SHORTSTR_CACHE_MAX:
            routes.clear()
        out = []
        for i, key in enumerate(keys):
            if key is None:
                raise self._bad(name, i, None, f"a row needs a key to pick its partition of super stream '{self.options.super_stream}'")
            route = routes.get(key)
            if route is None:
                route = routes[key] = partition_of(key, count)
            out.append(route)
        return out

    def messages(self, batch: pa.RecordBatch) -> Iterator[Outgoing]:
        columns = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        bodies = self._bodies(columns)
        routed = self._routed(columns, n) if self.options.super_stream else None
        keys = self._names(columns.get("routing_key"), n, self.default_key or "", "routing_key") if routed is None else []
        exchanges = self._names(columns.get("exchange"), n, None, "exchange")
        props = self._property_rows(columns, n)
        self.position += n
        cache = self._shortstr_cache
        if len(cache) > SHORTSTR_CACHE_MAX:
            cache.clear()
        for i in range(n):
            exchange_name = exchanges[i]
            exchange = (
                self.default_exchange
                if exchange_name is None
                else cache.get(exchange_name) or cache.setdefault(exchange_name, _shortstr(exchange_name))
            )
            if routed is None:
                key = keys[i]
                key_bytes = cache.get(key) or cache.setdefault(key, _shortstr(key))
            else:
                key_bytes = routed[i]
            body = bodies[i]
            prop_bytes = self._constant_props if props is None else props[i]
            yield Outgoing(exchange, key_bytes, struct.pack(">HHQ", 60, 0, len(body)) + prop_bytes, body)

    def _bodies(self, columns: dict[str, pa.Array]) -> list[bytes]:
        """The batch's bodies as bytes, each checked: not null, not over the size limit."""
        body_col = columns["body"]
        if body_col.null_count:
            row = body_col.is_null().to_pylist().index(True)
            raise self._bad("body", row, None, "every message needs a body (use an empty string)")
        bodies: list[bytes] = body_col.to_pylist()
        if pa.types.is_string(body_col.type) or pa.types.is_large_string(body_col.type):
            bodies = [b.encode("utf-8") for b in bodies]  # type: ignore[attr-defined]
        limit = self.max_message_size
        for i, body in enumerate(bodies):
            if len(body) > limit:
                raise self._bad("body", i, body, f"{len(body)} bytes is larger than the broker accepts ({self._limit_said})")
        return bodies

    def _bad(self, column: str, row: int, value: Any, reason: str) -> AmqpOptionError:
        kind = "null" if value is None else type(value).__name__
        shown = "" if value is None or isinstance(value, bytes) else f" {_short(value)}"
        published = (
            f"nothing of its batch was published, the {self.position} row(s) before that batch were"
            if self.position
            else "nothing of this partition was published"
        )
        return AmqpOptionError(f"column '{column}', row {self.position + row} of this partition ({kind}{shown}): {reason}; {published}")

    def _names(self, column: pa.Array | None, n: int, default: str | None, name: str, shortstr: bool = True) -> list[Any]:
        """Per-row names; a null (or no column) takes ``default``. A ``shortstr`` goes on the wire: 255 bytes at most."""
        if column is None:
            return [default] * n
        values: list[Any] = column.to_pylist()
        for i, value in enumerate(values):
            if value is None:
                values[i] = default
            elif shortstr and len(value.encode("utf-8")) > 255:
                raise self._bad(name, i, value, f"{len(value.encode('utf-8'))} bytes; AMQP allows at most 255")
        return values

    def _property_rows(self, columns: dict[str, pa.Array], n: int) -> list[bytes] | None:
        filters = columns[self.filter_column].to_pylist() if self.filter_column in columns else None
        if filters is None and not any(c in columns for c in PROPERTY_COLUMNS):
            return None
        made = basic_headers(columns, n, filters, self.options.persistent)
        if made is not None:
            return made
        rows = self._raw_properties(columns, n, always=True) or []
        out = []
        persistent = 2 if self.options.persistent else None
        for i, row in enumerate(rows):
            if filters is not None and filters[i] is not None:
                row["headers"] = _with_filter_value(row.get("headers"), filters[i])
            kwargs = {_PAMQP_NAMES.get(c, c): v for c, v in self._checked(row, i).items()}
            kwargs.setdefault("delivery_mode", persistent)
            try:
                out.append(marshal(kwargs))
            except (ValueError, TypeError, OverflowError, struct.error, decimal.InvalidOperation) as err:
                column, reason = _culprit(row, err)
                raise self._bad(column, i, row.get(column), reason) from None
        return out

    def _raw_properties(self, columns: dict[str, pa.Array], n: int, always: bool = False) -> list[dict[str, Any]] | None:
        """Per row, its property columns that are not null (None when the batch has none, unless ``always``)."""
        present = [c for c in PROPERTY_COLUMNS if c in columns]
        if not present and not always:
            return None
        values = [(c, columns[c].to_pylist()) for c in present]
        return [{c: v[i] for c, v in values if v[i] is not None} for i in range(n)]

    def _checked(self, row: dict[str, Any], i: int) -> dict[str, Any]:
        """Each property of a row as pamqp takes it; a bad value fails the batch, naming its column and row."""
        try:
            return {c: _property_value(c, v) for c, v in row.items()}
        except (ValueError, TypeError, OverflowError, struct.error, decimal.InvalidOperation) as err:
            column, reason = _culprit(row, err)
            raise self._bad(column, i, row.get(column), reason) from None


PROPERTY_COLUMNS = (*STRING_PROPERTY_COLUMNS, *INT_PROPERTY_COLUMNS, "timestamp", "headers")


def _with_filter_value(headers: Any, value: str) -> list[tuple[str, Any]]:
    """The row's headers and its filter value (which wins over a header of that name: it comes last)."""
    items = list(headers.items() if isinstance(headers, dict) else headers or [])
    return [*items, (FILTER_VALUE_HEADER, value)]


_PAMQP_NAMES = {"type": "message_type"}
_MAX_TIMESTAMP = 253402300799  # 9999-12-31T23:59:59Z, the last second a datetime (and Spark) holds


def _property_value(column: str, value: Any) -> Any:
    """A column's value as pamqp takes it, or ValueError saying what is wrong with it."""
    if column in INT_PROPERTY_COLUMNS:
        if not 0 <= value <= 255:
            raise ValueError("must be between 0 and 255 (an AMQP octet)")
        if column == "delivery_mode" and value not in (1, 2):
            raise ValueError("must be 1 (transient) or 2 (persistent)")
        return int(value)
    if column == "timestamp":
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.UTC)
            value = int(value.timestamp())
        if not 0 <= value <= _MAX_TIMESTAMP:
            raise ValueError("must be between 1970-01-01 and 9999-12-31 (AMQP timestamps are unsigned epoch seconds)")
        return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
    if column == "headers":
        # Arrow maps come as (key, value) pairs; rows (PySpark 4.0 streaming) as dicts.
        items = value.items() if isinstance(value, dict) else value
        table = {}
        for k, v in items:
            table[str(k)] = bytearray(v) if isinstance(v, bytes) else v  # pamqp encodes bytearray as a byte array ('x')
        field_table(table)  # a key too long or a value refused raises here, rather than halfway through a header
        return table
    if len(value.encode("utf-8")) > 255:
        raise ValueError(f"{len(value.encode('utf-8'))} bytes; AMQP short strings hold at most 255")
    if column == "expiration" and not value.isdigit():
        raise ValueError("must be a whole number of milliseconds, as a string (RabbitMQ refuses anything else)")
    return value


def _culprit(row: dict[str, Any], err: BaseException) -> tuple[str, str]:
    """Which column of a row that failed to encode is at fault, and why (each property alone)."""
    for column, value in row.items():
        try:
            kwargs = {_PAMQP_NAMES.get(column, column): _property_value(column, value)}
            marshal(kwargs)
        except (ValueError, TypeError, OverflowError, struct.error, decimal.InvalidOperation) as own:
            return column, str(own) or type(own).__name__
    return "headers" if "headers" in row else next(iter(row), "body"), str(err)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
