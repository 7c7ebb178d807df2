"""What the Spark benchmarks share: their session, the batches of a query from its progress reports, and an AvailableNow run."""

from __future__ import annotations

import datetime
import time


def spark_session(app_name: str, master: str = "local[2]"):  # type: ignore[no-untyped-def]
    """A local session with Delta's jars, quiet, sized for the 2-core machine."""
    from sparkenv import local_spark

    spark = local_spark(
        app_name,
        master=master,
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "2g",
            "spark.ui.showConsoleProgress": "false",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.sql.streaming.numRecentProgressUpdates": "100000",  # BatchLog reads every batch from them
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class BatchLog:
    """Every batch with rows of one query: (rows, processing seconds, epoch seconds when it ended).

    Read from ``query.recentProgress`` (one JSON document a batch), not through a Python
    ``StreamingQueryListener``: behind such a listener py4j resolves every field by reflection,
    scanning Spark's jars for class names, and that cost the driver JVM about as much CPU as the
    query's own work while it ran (JFR, RabbitMQ 4.3, 200k messages: 45% of the JVM's samples),
    on the same two cores the measured source and broker run on.
    """

    def __init__(self, query) -> None:  # type: ignore[no-untyped-def]
        self.query = query

    @property
    def batches(self) -> list[tuple[int, float, float]]:
        out = []
        for progress in self.query.recentProgress:
            if progress.numInputRows:
                seconds = progress.durationMs.get("triggerExecution", 0) / 1000.0
                began = datetime.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
                out.append((progress.numInputRows, seconds, began + seconds))
        return out

    @property
    def rows(self) -> int:
        return sum(b[0] for b in self.batches)

    @property
    def seconds(self) -> float:
        return sum(b[1] for b in self.batches)


def run_to_end(spark, writer) -> tuple[BatchLog, float]:  # type: ignore[no-untyped-def]
    """Start ``writer`` (an AvailableNow query) and wait for it: (its batches, wall seconds including query start-up)."""
    start = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    wall = time.perf_counter() - start
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    return BatchLog(query), wall
