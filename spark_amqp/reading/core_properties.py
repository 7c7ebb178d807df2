"""Queue deliveries' property columns made by the compiled core: AMQP 0-9-1's from their content headers
(``spark_amqp_core.basic_properties``), AMQP 1.0's from their sections before the body (``Builder.add_message``).

The core decodes a batch's raw content headers (what ``LazyProperties`` keeps) and renders the headers as
``arrow.render_header`` does, in one call, and hands the columns over as Arrow buffers. It takes a batch whole or not
at all: ``property_arrays`` gives None, and the Python path makes the columns, where the core is not used
(``stream_protocol.core``: none installed, another ABI, ``SPARK_AMQP_PURE_PYTHON=1``), where a message's properties
were already decoded (``pop_long_header`` may have changed them since), and for every header the core leaves to Python
(nested tables and arrays, decimals, unknown field types, repeated or non-UTF-8 keys, anything truncated). Both paths
give equal Arrow data: tests/queues/test_core_properties*.py. Over AMQP 1.0 (``queues.amqp10_rows.LazySections``)
the core leaves a batch to Python where it would leave a stream's message (``stream_protocol.core``), and on RabbitMQ
3.x's conversion, which only Python has: tests/queues/test_core_sections.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from ..property_columns import INT_PROPERTIES, STRING_PROPERTIES
from ..stream_protocol import core

__all__ = ["BUILDER_COLUMNS", "PROPERTY_ARRAYS", "property_arrays", "queue_rows_path", "variable_array"]

_HEADERS_TYPE = pa.map_(pa.string(), pa.string())
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# What basic_properties gives, in this order (None for a column not asked for).
_COLUMNS = (*STRING_PROPERTIES, *INT_PROPERTIES, "timestamp", "headers", "raw_header")
# The property columns a stream message's sections give (raw_header is an AMQP 0-9-1 reader's only).
_SECTION_COLUMNS = _COLUMNS[:-1]
# What Builder.finish gives after the row count, in STREAM_ARROW_SCHEMA's order (raw_header, always null, left out).
BUILDER_COLUMNS = ("body", "queue", "exchange", "routing_key", "offset", *STRING_PROPERTIES, *INT_PROPERTIES, "timestamp", "headers")


def queue_rows_path() -> str:
    """Which path makes the queue source's rows, in words (its runner logs it as it starts)."""
    return f"rows: pure Python but the property columns: {core.PATH}" if core.CORE is not None else f"rows: {core.PATH}"


def property_arrays(props: Sequence[Any], wanted: Sequence[str]) -> list[pa.Array] | None:
    """The property columns ``wanted`` (by name, in that order) of ``props``, or None where the Python path makes them."""
    module = core.CORE
    if module is None or not props:
        return None
    if hasattr(props[0], "core_sections"):
        return _from_sections(props, wanted)
    try:
        headers = [p.core_header for p in props]
    except AttributeError:  # not LazyProperties: pika's in tests, the stream protocol's rows
        return None
    if None in headers:
        return None
    parts = module.basic_properties(headers, list(wanted))
    if parts is None:
        return None
    n = len(props)
    made = dict(zip(_COLUMNS, parts, strict=True))
    return [PROPERTY_ARRAYS[name](n, made[name]) for name in wanted]


def _from_sections(props: Sequence[Any], wanted: Sequence[str]) -> list[pa.Array] | None:
    """AMQP 1.0 deliveries' property columns from their sections before the body, each added to one builder. Every
    property column is made, whatever ``wanted`` says: Python decodes them all (the ledger reads a delivery's headers
    and timestamp), so a value it refuses in a column nobody asked for fails the batch on both paths."""
    n = len(props)
    builder = core.builder("", props[0].conversion, None, False, _SECTION_COLUMNS)
    if builder is None:
        return None
    add = builder.add_message
    try:
        for p in props:
            if add(p.core_sections, 0) is None:
                return None
    except AttributeError:  # a delivery decoded whole as it arrived (an amqp-value body) among them
        return None
    columns = dict(zip(BUILDER_COLUMNS, builder.finish()[1:], strict=True))
    return [pa.nulls(n, pa.binary()) if name == "raw_header" else PROPERTY_ARRAYS[name](n, columns[name]) for name in wanted]


def _buffer(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def variable_array(kind: pa.DataType, n: int, column: tuple[Any, ...]) -> pa.Array:
    """A string or binary array of ``n`` from the core's (validity or None, null count, offsets, data)."""
    valid, nulls, offsets, data = column
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def _fixed(kind: pa.DataType, n: int, column: tuple[Any, ...]) -> pa.Array:
    valid, nulls, values = column
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(values)], nulls)


def _headers(n: int, headers: tuple[Any, ...]) -> pa.Array:
    valid, nulls, map_offsets, keys, values = headers
    entries = len(keys[2]) // 4 - 1  # i32 offsets, one more than the entries
    pairs = pa.StructArray.from_arrays(
        [variable_array(pa.string(), entries, keys), variable_array(pa.string(), entries, values)],
        fields=[_HEADERS_TYPE.key_field, _HEADERS_TYPE.item_field],
    )
    return pa.Array.from_buffers(_HEADERS_TYPE, n, [_buffer(valid), pa.py_buffer(map_offsets)], nulls, children=[pairs])


# A property column from the core's buffers: (row count, the column's buffers) -> array; the stream core's too (held.py).
PROPERTY_ARRAYS: dict[str, Callable[[int, Any], pa.Array]] = {
    **{name: (lambda n, c: variable_array(pa.string(), n, c)) for name in STRING_PROPERTIES},
    "priority": lambda n, c: _fixed(pa.int32(), n, c),
    "delivery_mode": lambda n, c: _fixed(pa.int32(), n, c),
    "timestamp": lambda n, c: _fixed(_TIMESTAMP, n, c),
    "headers": _headers,
    "raw_header": lambda n, c: variable_array(pa.binary(), n, c),
}
