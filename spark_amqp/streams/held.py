"""``HeldRows``: what a range reader holds for its caller, in offset order, until ``next_rows`` takes it.

Two kinds of rows arrive: row tuples from the pure-Python path (``RowMaker``: every AMQP reader, and a chunk the
compiled core leaves to Python), and whole chunks the compiled core turns into Arrow columns. The core's rows stay in
its builder across chunks and become one Arrow batch when they are taken, or when a Python row comes after them: a
batch handed to pyarrow costs tens of microseconds, a chunk may hold only a few dozen messages. What is taken is a list
of record batches in offset order, which concatenated equal the one batch the Python path alone would make.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ..reading import arrow
from ..reading.core_properties import BUILDER_COLUMNS, PROPERTY_ARRAYS, variable_array
from ..reading.projection import Projection
from ..stream_protocol import core

__all__ = ["HeldRows", "log_rows_path", "rows_path"]

Row = tuple[bytes, str, str, str, int, Any]


class HeldRows:
    """Row tuples and the core's builder's rows, in order; ``len`` counts both. ``columns``: what the batches hold
    (None: every column)."""

    __slots__ = ("_builder", "_columns", "_count", "_parts")

    def __init__(self, columns: Projection | None = None) -> None:
        self._parts: list[list[Row] | pa.RecordBatch] = []  # before the builder's rows
        self._count = 0  # rows in _parts
        self._builder: Any = None
        self._columns = columns

    def __len__(self) -> int:
        return self._count + (self._builder.rows if self._builder is not None else 0)

    def use(self, builder: Any) -> None:
        """Make the core's rows with ``builder`` from now on (None: Python makes every row), after those held."""
        self._seal()
        self._builder = builder

    def add_chunk(self, chunk: memoryview, skip: int, stop: int) -> bool:
        """Whether the core took the chunk (its records ``skip`` to ``stop - 1`` the filter keeps, now held). It
        checks the whole chunk either way; not taken, nothing was added and the chunk is Python's."""
        return self._builder is not None and self._builder.add(chunk, skip, stop) is not None

    def add_message(self, message: bytes, offset: int) -> bool | None:
        """Whether the core made the row of one message delivered alone (True), or the row filter left it out (False);
        None: nothing was added, the message is Python's."""
        if self._builder is None:
            return None
        kept: bool | None = self._builder.add_message(message, offset)
        return kept

    def append(self, row: Row) -> None:
        self.extend([row])

    def extend(self, rows: list[Row]) -> None:
        if not rows:
            return
        self._seal()
        last = self._parts[-1] if self._parts else None
        if isinstance(last, list):
            last.extend(rows)
        else:
            self._parts.append(list(rows))
        self._count += len(rows)

    def take(self) -> list[pa.RecordBatch]:
        """Every row held, as record batches in offset order, and nothing held after."""
        self._seal()
        parts, self._parts, self._count = self._parts, [], 0
        return [arrow.to_stream_batch(p, self._columns) if isinstance(p, list) else p for p in parts]

    def _seal(self) -> None:
        """The builder's rows into a batch of their own, so that whatever comes next comes after them."""
        if self._builder is not None and self._builder.rows:
            batch = to_batch(self._builder.finish(), self._columns)
            self._parts.append(batch)
            self._count += batch.num_rows


def to_batch(parts: tuple[Any, ...], columns: Projection | None = None) -> pa.RecordBatch:
    """``Builder.finish``'s buffers (core/src/python.rs) as a STREAM_ARROW_SCHEMA batch, or one of ``columns``: the
    buffers become the arrays' own (``pa.Array.from_buffers``), nothing is converted value by value. The core gives
    None for a column it did not make."""
    n, *buffers = parts
    made = dict(zip(BUILDER_COLUMNS, buffers, strict=True))
    names = arrow.STREAM_ARROW_SCHEMA.names if columns is None else columns.names
    arrays = [pa.nulls(n, pa.binary()) if name == "raw_header" else _ARRAYS[name](n, made[name]) for name in names]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow.STREAM_ARROW_SCHEMA if columns is None else columns.schema)


_ARRAYS: dict[str, Callable[[int, Any], pa.Array]] = {
    "body": lambda n, c: variable_array(pa.binary(), n, c),
    **{name: (lambda n, c: variable_array(pa.string(), n, c)) for name in ("queue", "exchange", "routing_key")},
    "offset": lambda n, c: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(c)], 0),
    **PROPERTY_ARRAYS,
}


def rows_path(stream_protocol: bool = True, amqp10: bool = False) -> str:
    """Which path makes a stream source's rows, in words (``spark_amqp.rows_path``, the source runner's log): over the
    stream protocol, over AMQP 1.0 (each message's row), or over AMQP 0-9-1 (``stream_protocol`` and ``amqp10`` false)."""
    if amqp10 and core.CORE is not None:
        return f"rows: {core.PATH}, a row for each message AMQP 1.0 delivers"
    if not stream_protocol:
        if core.CORE is not None:
            return "rows: pure Python but AMQP 0-9-1's property columns, the compiled core's (whole rows: over the stream protocol and AMQP 1.0)"
        return "rows: pure Python (the compiled core reads the stream protocol's chunks, AMQP 1.0's stream messages and AMQP 0-9-1's property columns)"
    return f"rows: {core.PATH}"


def log_rows_path(log: logging.Logger, stream_protocol: bool, amqp10: bool = False) -> None:
    """One line at the start of a source runner: which path makes the rows (a warning where the compiled core should
    run and does not). The executors' Python decides for their tasks; on one machine it is the same."""
    said = rows_path(stream_protocol, amqp10)
    if stream_protocol and core.MISSING:
        log.warning("AMQP source: %s; the stream protocol's reads cost about 15x more CPU without it", said)
    else:
        log.info("AMQP source: %s", said)
