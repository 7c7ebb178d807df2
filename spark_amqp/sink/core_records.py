"""The sinks' messages written by the compiled core: AMQP 1.0 messages (``spark_amqp_core.amqp10_records``) and the
AMQP 0-9-1 sink's content-header properties (``basic_headers``).

The core takes a batch's property columns as Arrow buffers, with no Python object per value, and writes every row's
message, byte for byte what ``Amqp10Encoder`` writes, or its properties, byte for byte what pamqp marshals. It takes a batch whole or not at all: ``amqp10_records`` gives
None, and Python writes the batch, where the core is not used (``stream_protocol.core``: none installed, another ABI,
``SPARK_AMQP_PURE_PYTHON=1``), for columns of a type it does not read (timestamps in another unit than Spark's
microseconds, headers holding timestamps or decimals), and for every row it leaves to Python: a value Python refuses
(which Python then names), a header key Python's dict would merge or pamqp would truncate, a symbol that is not ASCII. Both paths give the same
bytes: tests/sink/test_core_records.py.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pamqp import encode

from ..property_columns import INT_PROPERTIES, STRING_PROPERTIES
from ..stream_protocol import core
from ..stream_protocol.rows import Conversion

__all__ = ["amqp10_records", "basic_headers"]

Column = tuple[bytes | None, int, bytes, bytes | None]

# Header values by the kind the core writes them as (after a cast to the first type named): Python's _app_value
# encodes every integer as a long and every float as a double.
_VALUE_KINDS: tuple[tuple[Any, pa.DataType, str], ...] = (
    (pa.types.is_string, pa.string(), "string"),
    (pa.types.is_large_string, pa.string(), "string"),
    (pa.types.is_binary, pa.binary(), "binary"),
    (pa.types.is_large_binary, pa.binary(), "binary"),
    (pa.types.is_boolean, pa.bool_(), "bool"),
    (pa.types.is_integer, pa.int64(), "long"),
    (pa.types.is_floating, pa.float64(), "double"),
)


def _bytes(buffer: pa.Buffer | None) -> bytes | None:
    return None if buffer is None else buffer.to_pybytes()


def _column(array: pa.Array) -> Column:
    """An array's validity, offset and value buffers (a string's offsets and data), as the core reads them."""
    buffers = array.buffers()
    validity = buffers[0] if array.null_count else None
    return (_bytes(validity), array.offset, buffers[1].to_pybytes(), _bytes(buffers[2]) if len(buffers) > 2 else None)


def _strings(array: pa.Array) -> Column | None:
    if pa.types.is_large_string(array.type):
        array = array.cast(pa.string())
    return _column(array) if pa.types.is_string(array.type) else None


def _timestamp(array: pa.Array) -> tuple[Column, bool] | None:
    """Epoch seconds (an integer column) or Spark's microseconds; None for any other unit (Python's)."""
    if pa.types.is_integer(array.type):
        return _column(array.cast(pa.int64())), False
    if pa.types.is_timestamp(array.type) and array.type.unit == "us":
        return _column(array.cast(pa.int64())), True
    return None


def _headers(array: pa.Array) -> tuple[Any, ...] | None:
    if not pa.types.is_map(array.type) or not pa.types.is_string(array.type.key_type) or array.values.offset:
        return None
    items = array.items
    kind = next(((cast, name) for test, cast, name in _VALUE_KINDS if test(items.type)), None)
    if kind is None:
        return None
    buffers = array.buffers()
    validity = buffers[0] if array.null_count else None
    return (_bytes(validity), array.offset, buffers[1].to_pybytes(), _column(array.keys), kind[1], _column(items.cast(kind[0])))


def _property_columns(columns: dict[str, pa.Array]) -> tuple[Any, ...] | None:
    """The property columns as the core takes them (strings, priority, delivery_mode, timestamp, headers), or None
    where one is of a type it does not read."""
    strings: list[Column | None] = []
    for name in STRING_PROPERTIES:
        column = columns.get(name)
        strings.append(None if column is None else _strings(column))
        if column is not None and strings[-1] is None:
            return None
    try:  # a cast that fails (an unsigned value past a long's) leaves the batch to Python, which names the value
        ints = [_column(columns[name].cast(pa.int64())) if name in columns else None for name in INT_PROPERTIES]
        timestamp = _timestamp(columns["timestamp"]) if "timestamp" in columns else None
        headers = _headers(columns["headers"]) if "headers" in columns else None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if ("timestamp" in columns and timestamp is None) or ("headers" in columns and headers is None):
        return None
    return (strings, *ints, timestamp, headers)


def amqp10_records(
    columns: dict[str, pa.Array],
    bodies: list[bytes],
    conversion: Conversion,
    persistent: bool,
    *,
    exchanges: list[str | None] | None = None,
    keys: list[str | None] | None = None,
    filters: list[str | None] | None = None,
    tos: list[str] | None = None,
) -> list[bytes] | None:
    """Every row's whole message (``Amqp10Encoder.record`` of its ``cached_prefix``), or None where Python writes them."""
    module = core.CORE
    if module is None or not bodies:
        return None
    properties = _property_columns(columns)
    if properties is None:
        return None
    records: list[bytes] | None = module.amqp10_records(
        bodies, *properties, exchanges, keys, filters, tos, conversion.legacy, conversion.address_reply_to, persistent
    )
    return records


def basic_headers(columns: dict[str, pa.Array], n: int, filters: list[str | None] | None, persistent: bool) -> list[bytes] | None:
    """Every row's content-header properties (what ``MessageBuilder._property_rows`` gives), or None where Python
    writes them (also wherever pamqp writes integers as RabbitMQ before 3.6 read them)."""
    module = core.CORE
    if module is None or not n or encode.DEPRECATED_RABBITMQ_SUPPORT:
        return None
    properties = _property_columns(columns)
    if properties is None:
        return None
    made: list[bytes] | None = module.basic_headers(n, *properties, filters, persistent)
    return made
