"""``format("amqp")`` writes from a thread of the user's (issue 28).

Classic Spark's writers (``df.write.save``, ``writeStream.start``) look a Python data source
up in the JVM's active session, a thread-local (``DataSource.lookupDataSource``), not in the
DataFrame's session; the readers use their own session. PySpark pins each Python thread to a
JVM thread of its own, where no session is active: from a new thread the write fails with
``DATA_SOURCE_NOT_FOUND``, registered or auto-registered alike, until ``spark_amqp.register``
runs in that thread (it sets the thread's active session).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

import spark_amqp

from ..broker.helpers import connect, drain
from ..brokers import counts, publish
from .triggers import run_to_the_end

pytestmark = pytest.mark.spark

T = TypeVar("T")
BATCH, STREAMED = 20, 10


def in_a_new_thread(fn: Callable[[], T]) -> T:
    """Runs ``fn`` in a Python thread of its own, as a user's ``concurrent.futures`` pool does."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_writes_from_a_thread_need_register_in_that_thread(spark, amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst = names.queue("src"), names.queue("dst")
    publish(amqp_url, src, [b"s%d" % i for i in range(STREAMED)], message_id=lambda i: f"s{i}")
    publish(amqp_url, dst, [])
    amqp = {"uri": amqp_url, "routingKey": dst}
    rows = spark.range(BATCH).selectExpr("cast(id as string) as body", "concat('b', id) as message_id").coalesce(1)

    def stream_writer(checkpoint: str):  # type: ignore[no-untyped-def]
        stream = spark.readStream.format("amqp").option("uri", amqp_url).option("queue", src).load()  # readers work anywhere
        return stream.select("body", "message_id").writeStream.format("amqp").options(**amqp).option("checkpointLocation", checkpoint)

    def without_register() -> None:
        # What the README's troubleshooting row describes: no active session in a new thread, so
        # both writers fail (the readers above do not look the source up this way).
        assert SparkSession.getActiveSession() is None
        with pytest.raises(Exception, match="DATA_SOURCE_NOT_FOUND"):
            rows.write.format("amqp").options(**amqp).mode("append").save()
        with pytest.raises(Exception, match="DATA_SOURCE_NOT_FOUND"):
            stream_writer(str(tmp_path / "failed")).start()

    def after_register() -> None:
        spark_amqp.register(spark)
        rows.write.format("amqp").options(**amqp).mode("append").save()

        def done() -> bool:
            return counts(amqp_url, dst, embedded_or_none) == (BATCH + STREAMED, 0) and counts(amqp_url, src, embedded_or_none) == (0, 0)

        run_to_the_end(stream_writer(str(tmp_path / "c")), done)

    spark_amqp.register(spark)  # on the main thread, as in the report: it does not reach other threads
    in_a_new_thread(without_register)
    in_a_new_thread(after_register)
    got = drain(connect(amqp_url).channel(), dst, limit=100)
    assert sorted(p.message_id for _, p, _ in got) == sorted([f"b{i}" for i in range(BATCH)] + [f"s{i}" for i in range(STREAMED)])
