"""``QueueReader``: Spark's ``DataSourceStreamReader`` for AMQP queues.

Every method but ``read`` runs in Spark's source-runner process and delegates
to a ``SourceRuntime`` created there on first use; ``read`` runs in executors on
a pickled copy that carries only the options, and gets its rows from the
Arrow data inside the partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..reading import arrow
from ..reading.read_limits import AVAILABLE_NOW_BASES, default_limit, limit_terms
from .offset import AmqpSourceOffset
from .options import SourceOptions
from .runtime import SourceRuntime


class QueueBatchPartition(InputPartition):
    """One slice of a micro-batch: its rows as an Arrow IPC stream."""

    def __init__(self, index: int, data: bytes) -> None:
        super().__init__(index)
        self.index = index
        self.data = data

    def __repr__(self) -> str:
        return f"QueueBatchPartition(index={self.index}, bytes={len(self.data)})"


class QueueReader(DataSourceStreamReader, *AVAILABLE_NOW_BASES):  # type: ignore[misc]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._runtime: SourceRuntime | None = None

    # The runtime (sockets, threads) lives only in the runner; never pickle it.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_runtime": None}

    @property
    def runtime(self) -> SourceRuntime:
        if self._runtime is None:
            self._runtime = SourceRuntime(self.options)
        return self._runtime

    def initialOffset(self) -> dict[str, Any]:
        self.runtime.ensure_started()  # fail fast on a bad queue or login
        # Spark may ask again after batches were planned: always the same value.
        return AmqpSourceOffset.initial(self.options.queues).to_json()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        return self.runtime.latest_offset(start, *limit_terms(limit))

    def getDefaultReadLimit(self) -> Any:
        return default_limit(self.options.trigger)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.runtime.backlog()

    def prepareForTriggerAvailableNow(self) -> None:
        self.runtime.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueBatchPartition]:
        return [QueueBatchPartition(i, data) for i, data in enumerate(self.runtime.partitions(start, end))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueBatchPartition)
        columns = self.options.columns
        for batch in arrow.from_ipc(partition.data):
            yield batch if columns is None else columns.conform(batch)  # a journal's batch holds every column

    def commit(self, end: dict[str, Any]) -> None:
        self.runtime.commit(end)

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.shutdown()
