"""``StreamBatchReader``: ``spark.read`` of a bounded range of each stream.

The bounds are resolved once, on the driver, when Spark plans the read
(``partitions``): where each stream starts and ends as offsets. Executors then
read those ranges with the streaming source's range reader, so the rows, the
schema and the data-loss checks are the same, and reading the same offsets
twice gives the same rows. ``latest`` and timestamps are turned into offsets at
planning; the plan's offsets are in the driver's log.

A moment (``startingTimestamp`` and the like) is a position to the chunk, as a
consumer at a timestamp sees it: the first chunk written at or after it, to the
second. As an end it is exclusive: the read stops before that chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..client.blocking import BlockingClient
from ..errors import AmqpOptionError
from . import expression_filters
from .access import BrokerAccess, access_for
from .options import At, End, Start, StreamSourceOptions
from .ranges import split
from .reader import StreamRangePartition, read_partition

__all__ = ["StreamBatchReader", "resolve_bounds"]

log = logging.getLogger("spark_amqp.streams")


class StreamBatchReader(DataSourceReader):
    def __init__(self, options: StreamSourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        starts, ends = resolve_bounds(self.options)
        log.info("AMQP source: batch read of %s", {s: (starts[s], ends[s]) for s in starts})
        ranges = split(starts, ends, self.options.num_partitions, self.options.min_partition_size)
        return [StreamRangePartition(i, r.stream, r.start, r.end) for i, r in enumerate(ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.options, partition)


def resolve_bounds(options: StreamSourceOptions) -> tuple[dict[str, int], dict[str, int]]:
    """Per stream, the first offset to read and the offset to stop before."""
    access = access_for(options.connection)
    client: BlockingClient[Any] = BlockingClient(options.connection, "spark-amqp stream batch read", access.connect)
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    try:
        # The first call opens the connection: what fails there is the read's (a refused filter explains itself).
        reading = (
            f"super stream '{options.discover}'" if options.discover is not None else ", ".join(f"stream '{s}'" for s in options.streams)
        )
        client.run(lambda c: access.require(c, options), reading)
        name = options.discover
        streams = options.streams if name is None else client.run(lambda c: access.partitions_of(c, name), f"super stream '{name}'")
        if streams:
            client.run(lambda c: expression_filters.require(options.expression, options.connection, streams[0]), reading)
        for stream in streams:
            start, end = options.start_of(stream), options.end_of(stream)
            latest, start_at, end_at = client.run(_asker(access, stream, start, end), f"stream '{stream}'")
            starts[stream] = _checked(stream, "startingOffsets", start, start_at, latest)
            ends[stream] = _checked(stream, "endingOffsets", end, end_at, latest)
    finally:
        client.close()
    for stream in streams:
        if starts[stream] > ends[stream]:
            raise AmqpOptionError(
                f"stream '{stream}': the read would start at offset {starts[stream]} but end before offset {ends[stream]} "
                f"(startingOffsets {_shown(options.start_of(stream))}, endingOffsets {_shown(options.end_of(stream))}): "
                "give a start at or before the end"
            )
    return starts, ends


def _asker(access: BrokerAccess, stream: str, start: Start, end: End) -> Callable[[Any], Awaitable[tuple[int, int | None, int | None]]]:
    return lambda client: _ask(access, client, stream, start, end)


async def _ask(access: BrokerAccess, client: Any, stream: str, start: Start, end: End) -> tuple[int, int | None, int | None]:
    """Where the stream ends, and the offsets the broker gives for a start or end that is a moment or ``first``."""
    last = await access.tail(client, stream)
    latest = 0 if last is None else last[0] + 1
    return latest, await _lookup(access, client, stream, start), await _lookup(access, client, stream, end)


async def _lookup(access: BrokerAccess, client: Any, stream: str, position: Start | End) -> int | None:
    if isinstance(position, At):
        return await access.offset_at(client, stream, position.epoch_ms)
    if position == "first":
        return await access.head(client, stream)
    return None


def _checked(stream: str, key: str, position: Start | End, found: int | None, latest: int) -> int:
    """The offset of ``position``, given the broker's answers: a moment nothing follows, or ``first`` on an
    empty stream, is where the stream ends; an offset past that end is refused, naming the option."""
    if isinstance(position, At) or position == "first":
        return latest if found is None else found
    if isinstance(position, int):
        if position > latest:
            verb = "starts" if key == "startingOffsets" else "ends"
            raise AmqpOptionError(
                f"option '{key}' {verb} stream '{stream}' at offset {position}, past its end (the next offset it will "
                f"write is {latest}): give an offset up to {latest}, or 'latest'"
            )
        return position
    if position == "last":
        return max(0, latest - 1)
    return latest  # next / latest


def _shown(position: Start | End) -> str:
    return f"at {position.epoch_ms} ms" if isinstance(position, At) else str(position)
