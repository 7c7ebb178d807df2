"""The Databricks example's drain loop (``examples/databricks/amqp_to_delta_job.py``) under local
Spark: on Spark 4.0/4.1 it is how a job reads a queue to its end, so it runs on every line."""

from __future__ import annotations

import pytest

from ..broker.helpers import wait_for
from ..brokers import counts, publish
from .deploy_job import databricks_job
from .file_sink import rows_written

pytestmark = pytest.mark.spark
JOB = databricks_job()


def test_idle_triggers_counts_empty_progress_since_the_last_rows() -> None:
    events = [{"numInputRows": n} for n in (5, 0, 7, 0, 0)]
    assert JOB.idle_triggers(events) == 2
    assert JOB.idle_triggers(events[:3]) == 0
    assert JOB.idle_triggers([{"numInputRows": 0}]) == 1 and JOB.idle_triggers([]) == 0
    assert JOB.available_now_drains("4.2.0") and JOB.available_now_drains("5.0.1")
    assert not JOB.available_now_drains("4.1.4") and not JOB.available_now_drains("4.0.0")


def test_processing_time_batches_stop_once_the_queue_is_drained(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(250)], message_id=lambda i: f"id{i}")
    assert JOB.ready_messages({"uri": amqp_url, "queue": q}) == 250
    out = tmp_path / "out"
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "500ms")
    try:
        query = (
            spark.readStream.format("amqp")
            .option("uri", amqp_url)
            .option("queue", q)
            .option("maxMessagesPerTrigger", "100")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "c"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        said: list[str] = []
        JOB.drain_with_batches(query, lambda: JOB.ready_messages({"uri": amqp_url, "queue": q}), poll_seconds=0.2, log=said.append)
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    assert not query.isActive and said and "drained" in said[-1]
    assert sorted(r["message_id"] for r in rows_written(spark, out)) == sorted(f"id{i}" for i in range(250))
    # Every batch was acknowledged before the query stopped: nothing comes back.
    assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=20)
