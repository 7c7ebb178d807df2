"""Drives a ``SourceRuntime`` the way Spark's MicroBatchExecution does, without Spark."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from spark_amqp.queues.options import parse_source_options
from spark_amqp.queues.reader import QueueBatchPartition, QueueReader
from spark_amqp.queues.runtime import SourceRuntime


class MicroBatchDriver:
    def __init__(self, url: str, queue: str, schema: StructType | None = None, **options: Any) -> None:
        """``schema``: the reader's (some columns), as a query's ``.schema(...)``."""
        opts = {"uri": url, "queue": queue, **{k: str(v) for k, v in options.items()}}
        parsed = parse_source_options(opts, schema)
        self.runtime = SourceRuntime(parsed)
        self.reader = QueueReader(parsed)  # read(), as an executor runs it
        self.start = self.runtime.last_end.to_json()
        self.rows: list[dict[str, Any]] = []
        self.batches = 0

    def plan(self, max_rows: int | None = None, wait: float = 5.0) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """latestOffset until it moves (or ``wait`` runs out); returns (start, end) or None."""
        deadline = time.monotonic() + wait
        while True:
            end = self.runtime.latest_offset(self.start, max_rows)
            if end != self.start:
                return self.start, end
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def run_batch(self, start: dict[str, Any], end: dict[str, Any], commit_previous: bool = True) -> list[dict[str, Any]]:
        if commit_previous:
            self.runtime.commit(start)
        rows: list[dict[str, Any]] = []
        for i, data in enumerate(self.runtime.partitions(start, end)):
            for batch in self.reader.read(QueueBatchPartition(i, data)):
                rows.extend(pa.Table.from_batches([batch]).to_pylist())
        self.rows.extend(rows)
        self.start = end
        self.batches += 1
        return rows

    def drain(self, expected: int, max_rows: int | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.rows) < expected and time.monotonic() < deadline:
            planned = self.plan(max_rows, wait=0.5)
            if planned is not None:
                self.run_batch(*planned)
        return self.rows

    def idle_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Keep calling latestOffset as Spark does while idle (no new batch) until ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout}s while idle")
            end = self.runtime.latest_offset(self.start, 0)
            assert end == self.start, "idle_until must not plan batches"
            time.sleep(0.012)

    def close(self) -> None:
        self.runtime.shutdown()
