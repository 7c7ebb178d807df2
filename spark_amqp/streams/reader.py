"""``StreamReader``: Spark's ``DataSourceStreamReader`` for RabbitMQ stream queues.

Every method but ``read`` runs in Spark's source-runner process and delegates
to a ``StreamPlanner`` created there on first use. ``read`` runs in executors
on a pickled copy that carries only the options; its partition names an offset
range, which the task reads from the broker itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..errors import AmqpSourceError
from ..reading.read_limits import AVAILABLE_NOW_BASES, default_limit, limit_terms
from ..transport.outage import retried_since
from .options import StreamSourceOptions
from .planner import StreamPlanner
from .range_reader import read_range
from .ranges import StreamRange

__all__ = ["StreamRangePartition", "StreamReader"]


class StreamRangePartition(InputPartition):
    """One task of a micro-batch: offsets ``start`` to ``end - 1`` of one stream."""

    def __init__(
        self, index: int, stream: str, start: int, end: int, planned_at: float | None = None, quiet_since: float | None = None
    ) -> None:
        super().__init__(index)
        self.index = index
        self.stream = stream
        self.start = start
        self.end = end
        self.planned_at = time.time() if planned_at is None else planned_at  # the driver's clock
        # Planned from the last ends known while the planner heard nothing from the broker: since when (its clock). A
        # task that reaches no broker either counts its deadline from there, the query's last answer.
        self.quiet_since = quiet_since

    def __repr__(self) -> str:
        return f"StreamRangePartition(index={self.index}, stream={self.stream!r}, start={self.start}, end={self.end})"


class StreamReader(DataSourceStreamReader, *AVAILABLE_NOW_BASES):  # type: ignore[misc]
    def __init__(self, options: StreamSourceOptions) -> None:
        self.options = options
        self._planner: StreamPlanner | None = None

    # The planner (a connection and its thread) lives only in the runner; never pickle it.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_planner": None}

    @property
    def planner(self) -> StreamPlanner:
        if self._planner is None:
            self._planner = StreamPlanner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        return self.planner.initial_offset().to_json()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        return self.planner.latest_offset(start, *limit_terms(limit)).to_json()

    def getDefaultReadLimit(self) -> Any:
        return default_limit(self.options.trigger)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.planner.backlog()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamRangePartition]:
        quiet = self.planner.outage.since_wall  # as it was when the batch was planned
        ranges = self.planner.partitions(start, end)
        return [StreamRangePartition(i, r.stream, r.start, r.end, quiet_since=quiet) for i, r in enumerate(ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # nothing to acknowledge: the stream keeps its messages, and the checkpoint holds the offsets

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()


def read_partition(options: StreamSourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A task's range. In Spark's retry of the task, an outage counts from when the range was planned, so that Spark's
    attempts together wait ``brokerOutageTimeout`` and not each of them (``transport.outage.Outage``)."""
    if not isinstance(partition, StreamRangePartition):
        if getattr(partition, "value", None) is None:
            return  # PySpark's stand-in for a plan of no ranges (spark.read of an empty stream): nothing to read
        raise AmqpSourceError(f"internal error: a stream read was handed {partition!r}, not one of its ranges")
    since = retried_since(partition.planned_at)
    part = StreamRange(partition.stream, partition.start, partition.end)
    yield from read_range(options, part, retried_since=since, quiet_since=partition.quiet_since)
