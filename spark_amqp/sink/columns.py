"""What the sink accepts as input columns, and rows to AMQP messages.

Input columns: ``body`` (binary or string, required); optional ``routing_key``,
``exchange``, ``headers`` (a map with string keys) and the property columns of
the source schema. Columns only the source produces (``queue``,
``delivery_tag``, ``redelivered``) are ignored, so a DataFrame read from a queue
can be written back as it is. Any other column is an error, to catch typos.

The schema is checked on the driver before any task runs; values (null bodies,
routing keys over 255 bytes, oversized messages) are checked for a whole Arrow
batch before any message of that batch is published.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pamqp import commands, header

from ..errors import AmqpOptionError
from ..options import SinkOptions
from ..property_columns import INT_PROPERTIES as INT_PROPERTY_COLUMNS
from ..property_columns import STRING_PROPERTIES as STRING_PROPERTY_COLUMNS

SOURCE_ONLY_COLUMNS = ("queue", "delivery_tag", "redelivered", "raw_header")
ACCEPTED = ("body", "routing_key", "exchange", "headers", *STRING_PROPERTY_COLUMNS, *INT_PROPERTY_COLUMNS, "timestamp")
HEADER_VALUE_TYPES = ("string", "binary", "boolean", "byte", "short", "integer", "long", "float", "double", "timestamp", "decimal")


def check_schema(schema: Any) -> None:
    """Validate a Spark StructType of the input; raises AmqpOptionError naming the column."""
    fields = {f.name.lower(): f for f in schema.fields}
    if "body" not in fields:
        raise AmqpOptionError(
            f"the DataFrame to write needs a 'body' column (binary or string); it has: {', '.join(f.name for f in schema.fields)}"
        )
    unknown = [f.name for f in schema.fields if f.name.lower() not in ACCEPTED and f.name.lower() not in SOURCE_ONLY_COLUMNS]
    if unknown:
        raise AmqpOptionError(
            f"unknown column(s) {', '.join(unknown)}; the AMQP sink takes: {', '.join(ACCEPTED)} (drop or rename the others)"
        )

    def kind(name: str) -> str:
        return str(fields[name].dataType.typeName())

    if kind("body") not in ("binary", "string"):
        raise AmqpOptionError(f"column 'body' must be binary or string, not {fields['body'].dataType.simpleString()}")
    for name in ("routing_key", "exchange", *STRING_PROPERTY_COLUMNS):
        if name in fields and kind(name) != "string":
            raise AmqpOptionError(f"column '{name}' must be a string, not {fields[name].dataType.simpleString()}")
    for name in INT_PROPERTY_COLUMNS:
        if name in fields and kind(name) not in ("byte", "short", "integer", "long"):
            raise AmqpOptionError(f"column '{name}' must be an integer, not {fields[name].dataType.simpleString()}")
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
    """Turns Arrow record batches into messages, validating a whole batch first."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.default_exchange = _shortstr(options.exchange)
        self.default_key = options.routing_key
        self._shortstr_cache: dict[str, bytes] = {}
        constant = commands.Basic.Properties(delivery_mode=2 if options.persistent else None)
        self._constant_props = header.ContentHeader(0, 0, constant).marshal()[12:]

    def messages(self, batch: pa.RecordBatch) -> Iterator[Outgoing]:
        columns = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        body_col = columns["body"]
        if body_col.null_count:
            row = body_col.is_null().to_pylist().index(True)
            raise AmqpOptionError(f"column 'body' is null in row {row} of this batch: every message needs a body (use an empty string)")
        bodies = body_col.to_pylist()
        if pa.types.is_string(body_col.type) or pa.types.is_large_string(body_col.type):
            bodies = [b.encode("utf-8") for b in bodies]
        limit = self.options.max_message_size
        for i, body in enumerate(bodies):
            if len(body) > limit:
                raise AmqpOptionError(
                    f"row {i}: body of {len(body)} bytes is larger than the broker accepts (maxMessageSize {limit}); nothing of this batch was published"
                )
        keys = self._names(columns.get("routing_key"), n, self.default_key or "", "routing_key")
        exchanges = self._names(columns.get("exchange"), n, None, "exchange")
        props = self._property_rows(columns, n)
        cache = self._shortstr_cache
        for i in range(n):
            key = keys[i]
            exchange_name = exchanges[i]
            exchange = (
                self.default_exchange
                if exchange_name is None
                else cache.get(exchange_name) or cache.setdefault(exchange_name, _shortstr(exchange_name))
            )
            key_bytes = cache.get(key) or cache.setdefault(key, _shortstr(key))
            body = bodies[i]
            prop_bytes = self._constant_props if props is None else props[i]
            yield Outgoing(exchange, key_bytes, struct.pack(">HHQ", 60, 0, len(body)) + prop_bytes, body)

    def _names(self, column: pa.Array | None, n: int, default: str | None, name: str) -> list[Any]:
        """Per-row names; a null (or no column) takes ``default``."""
        if column is None:
            return [default] * n
        values: list[Any] = column.to_pylist()
        for i, value in enumerate(values):
            if value is None:
                values[i] = default
            elif len(value.encode("utf-8")) > 255:
                raise AmqpOptionError(f"column '{name}' in row {i} is {len(value.encode('utf-8'))} bytes; AMQP allows at most 255")
        return values

    def _property_rows(self, columns: dict[str, pa.Array], n: int) -> list[bytes] | None:
        present = [c for c in (*STRING_PROPERTY_COLUMNS, *INT_PROPERTY_COLUMNS, "timestamp", "headers") if c in columns]
        if not present:
            return None
        values = {c: columns[c].to_pylist() for c in present}
        out = []
        persistent = 2 if self.options.persistent else None
        for i in range(n):
            kwargs: dict[str, Any] = {}
            for c in STRING_PROPERTY_COLUMNS:
                if c in values and values[c][i] is not None:
                    kwargs["message_type" if c == "type" else c] = values[c][i]
            for c in INT_PROPERTY_COLUMNS:
                if c in values and values[c][i] is not None:
                    kwargs[c] = int(values[c][i])
            kwargs.setdefault("delivery_mode", persistent)
            if "timestamp" in values and values["timestamp"][i] is not None:
                ts = values["timestamp"][i]
                if isinstance(ts, int):
                    ts = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
                kwargs["timestamp"] = ts
            if "headers" in values and values["headers"][i] is not None:
                pairs = values["headers"][i]
                # Arrow maps come as (key, value) pairs; rows (PySpark 4.0 streaming) as dicts.
                items = pairs.items() if isinstance(pairs, dict) else pairs
                kwargs["headers"] = {str(k): _header_value(v) for k, v in items}
            try:
                props = commands.Basic.Properties(**kwargs)
                out.append(header.ContentHeader(0, 0, props).marshal()[12:])
            except (ValueError, TypeError) as err:
                raise AmqpOptionError(f"row {i}: invalid message properties {sorted(kwargs)}: {err}") from None
        return out


def _header_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return bytearray(value)  # pamqp encodes bytearray as a byte array ('x')
    return value
