"""What the Spark benchmarks share: their session, the batches of a query heard from a listener, and an AvailableNow run."""

from __future__ import annotations

import time

from pyspark.sql.streaming import StreamingQueryListener


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
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class BatchLog(StreamingQueryListener):  # type: ignore[misc]
    """Every batch with rows: (rows, processing seconds, when the listener heard of it)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, float, float]] = []

    @property
    def rows(self) -> int:
        return sum(b[0] for b in self.batches)

    @property
    def seconds(self) -> float:
        return sum(b[1] for b in self.batches)

    def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
        progress = event.progress
        if progress.numInputRows:
            seconds = progress.durationMs.get("triggerExecution", 0) / 1000.0
            self.batches.append((progress.numInputRows, seconds, time.monotonic()))

    def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
        pass


def run_to_end(spark, writer) -> tuple[BatchLog, float]:  # type: ignore[no-untyped-def]
    """Start ``writer`` (an AvailableNow query) and wait for it: (its batches, wall seconds including query start-up)."""
    log = BatchLog()
    spark.streams.addListener(log)
    try:
        start = time.perf_counter()
        query = writer.start()
        query.awaitTermination()
        wall = time.perf_counter() - start
    finally:
        time.sleep(1)  # listener events are delivered asynchronously
        spark.streams.removeListener(log)
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    return log, wall
