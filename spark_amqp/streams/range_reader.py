"""``read_range``: one task's offset range of a stream, as Arrow record batches, over the uri's protocol."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pyarrow as pa

from .options import StreamSourceOptions
from .range_base import RangeReader
from .range_over_amqp import ACK_SHARE, AmqpRangeReader
from .range_over_amqp10 import Amqp10RangeReader
from .range_over_protocol import ProtocolRangeReader
from .ranges import StreamRange

__all__ = ["ACK_SHARE", "BATCH_ROWS", "read_range", "reader_for"]

BATCH_ROWS = 10_000


def reader_for(options: StreamSourceOptions, part: StreamRange) -> RangeReader:
    """The range's reader over the protocol the options name."""
    connection = options.connection
    kind = ProtocolRangeReader if connection.stream_protocol else Amqp10RangeReader if connection.amqp10 else AmqpRangeReader
    return kind(options, part)


def read_range(
    options: StreamSourceOptions,
    part: StreamRange,
    batch_rows: int = BATCH_ROWS,
    retried_since: float | None = None,
    quiet_since: float | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the range's messages, in offset order. ``retried_since``: in Spark's retry of the task,
    when the range was planned; ``quiet_since``: since when the planner had heard nothing from the broker (``Outage``)."""
    loop = asyncio.new_event_loop()
    reader = reader_for(options, part)
    reader.outage.retried_since = retried_since
    reader.outage.quiet_since = quiet_since
    try:
        while not reader.exhausted:
            # Most often one batch; more where the compiled core's columns and Python's rows meet (``HeldRows``).
            yield from loop.run_until_complete(reader.next_rows(batch_rows))
    finally:
        loop.run_until_complete(reader.close())
        loop.close()
