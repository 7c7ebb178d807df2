"""The sink under Spark: batch and streaming writes, retries, up-front column checks."""

from __future__ import annotations

import threading
import uuid

import pytest
from spark_amqp_broker import EmbeddedBroker

from .. import brokers
from ..broker.helpers import connect, drain, wait_for
from ..brokers import counts, publish
from ..conftest import REAL_URL
from .triggers import run_to_the_end

pytestmark = pytest.mark.spark


def test_batch_write_round_trip(spark, amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [])
    df = spark.range(1000).selectExpr(
        "encode(cast(id as string), 'utf-8') as body",
        "concat('id', id) as message_id",
        "'application/octet-stream' as content_type",
        "cast(id % 5 as int) as priority",
        "timestamp_seconds(1700000000 + id) as timestamp",
        "map('n', id, 'even', id % 2) as headers",
    )
    df.write.format("amqp").option("uri", amqp_url).option("routingKey", q).mode("append").save()
    got = drain(connect(amqp_url).channel(), q, limit=2000)
    assert len(got) == 1000
    by_id = {p.message_id: (p, b) for _, p, b in got}
    p, body = by_id["id42"]
    assert body == b"42" and p.priority == 2 and p.content_type == "application/octet-stream"
    assert p.timestamp == 1700000042 and p.headers == {"n": 42, "even": 0} and p.delivery_mode == 2


def test_source_dataframe_written_back_as_it_is(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src, dst = names.queue(), names.queue()
    publish(amqp_url, src, [b"m%d" % i for i in range(30)], message_id=lambda i: f"id{i}", headers={"h": "v"})
    publish(amqp_url, dst, [])
    stream = spark.readStream.format("amqp").option("uri", amqp_url).option("queue", src).load().drop("routing_key")
    writer = (
        stream.writeStream.format("amqp")
        .option("uri", amqp_url)
        .option("routingKey", dst)
        .option("checkpointLocation", str(tmp_path / "c"))
    )
    run_to_the_end(writer, lambda: counts(amqp_url, dst, embedded_or_none) == (30, 0) and counts(amqp_url, src, embedded_or_none) == (0, 0))
    got = drain(connect(amqp_url).channel(), dst, limit=100)
    assert sorted(p.message_id for _, p, _ in got) == sorted(f"id{i}" for i in range(30))
    assert all(p.headers == {"h": "v"} for _, p, _ in got)


@pytest.mark.skipif(not REAL_URL or brokers.version(REAL_URL) < (4, 0), reason="AMQP 1.0 needs RabbitMQ 4.x (AMQP_TEST_BROKERS)")
def test_a_queue_read_and_written_back_over_amqp_1_0(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert REAL_URL is not None
    src, dst = (f"test.a10.{uuid.uuid4().hex[:8]}.{i}" for i in range(2))
    publish(REAL_URL, src, [b"m%d" % i for i in range(30)], message_id=lambda i: f"id{i}", headers={"h": "v"}, delivery_mode=2)
    publish(REAL_URL, dst, [])
    over_10 = {"uri": REAL_URL, "protocol": "amqp1.0"}
    try:
        stream = spark.readStream.format("amqp").options(**over_10).option("queue", src).load().drop("routing_key")
        writer = (
            stream.writeStream.format("amqp").options(**over_10).option("routingKey", dst).option("checkpointLocation", str(tmp_path / "c"))
        )
        run_to_the_end(writer, lambda: counts(REAL_URL, dst, None) == (30, 0) and counts(REAL_URL, src, None) == (0, 0))
        got = drain(connect(REAL_URL).channel(), dst, limit=100)
        assert sorted(p.message_id for _, p, _ in got) == sorted(f"id{i}" for i in range(30))
        assert all(p.headers == {"h": "v"} and p.delivery_mode == 2 for _, p, _ in got)
    finally:
        channel = connect(REAL_URL).channel()
        for q in (src, dst):
            channel.queue_delete(q)


@pytest.mark.parametrize(
    ("select", "fragment"),
    [
        (["cast(id as string) as payload"], "needs a 'body' column"),
        (["id as body"], "column 'body' must be binary or string"),
        (["'x' as body", "id as routing_key"], "column 'routing_key' must be a string"),
        (["'x' as body", "map('k', array(1)) as headers"], "column 'headers' has values of type array<int>"),
        (["'x' as body", "'y' as routing_kee"], "unknown column(s) routing_kee"),
    ],
)
def test_bad_columns_fail_before_any_task(spark, amqp_url: str, select: list[str], fragment: str) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(3).selectExpr(*select)
    with pytest.raises(Exception) as info:
        df.write.format("amqp").option("uri", amqp_url).mode("append").save()
    assert fragment in str(info.value)


@pytest.mark.embedded_only
def test_failed_task_is_retried_and_every_row_arrives(spark) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        publish(broker.url, "q", [])
        broker.hold_confirms()
        # Cut the sink's connection while its confirms are held: the task fails, Spark retries it.
        dropper = threading.Timer(3.0, lambda: (broker.drop_connections(name_contains="spark-amqp sink"), broker.release_confirms()))
        dropper.start()
        df = spark.range(2000).selectExpr("cast(id as string) as body", "concat('id', id) as message_id").coalesce(1)
        df.write.format("amqp").option("uri", broker.url).option("routingKey", "q").option("confirmTimeout", "60").mode("append").save()
        dropper.cancel()
        got = drain(connect(broker.url).channel(), "q", limit=10_000)
        ids = {p.message_id for _, p, _ in got}
        assert ids == {f"id{i}" for i in range(2000)}  # at least once: the retry may repeat some
        assert len(got) >= 2000


@pytest.mark.embedded_only
def test_nacks_fail_the_write_with_a_clear_error(spark) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        publish(broker.url, "q", [])
        broker.nack_next_publishes(10_000)  # every attempt is nacked
        df = spark.range(100).selectExpr("cast(id as string) as body").coalesce(1)
        with pytest.raises(Exception, match=r"nacked by the broker"):
            df.write.format("amqp").option("uri", broker.url).option("routingKey", "q").mode("append").save()
        assert wait_for(lambda: broker.queue_stats("q")["ready"] == 0)


def test_reject_publish_queue_fails_the_write_naming_the_nacks(spark, amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = connect(amqp_url)
    conn.channel().queue_declare(q, arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    conn.close()
    df = spark.range(100).selectExpr("cast(id as string) as body").coalesce(1)
    with pytest.raises(Exception, match=r"nacked by the broker.* of 100 messages published to exchange '' with routing key") as info:
        df.write.format("amqp").option("uri", amqp_url).option("routingKey", q).mode("append").save()
    assert "confirmed so far" in str(info.value)
    # The 10 that fit are in the queue; retries were nacked too, nothing was silently dropped.
    assert len(drain(connect(amqp_url).channel(), q, limit=200)) == 10


@pytest.mark.parametrize("scheme", ["amqp", "rabbitmq-stream"])
def test_a_broker_that_never_answers_fails_the_query_after_broker_outage_timeout_not_once_per_task_attempt(
    spark, tmp_path, scheme: str
) -> None:  # type: ignore[no-untyped-def]
    # Spark runs a failed task again (3 attempts in the tests' session, 4 on a cluster). Each attempt waiting the
    # whole deadline made a sink that reaches no node fail the query after attempts x brokerOutageTimeout.
    import json
    import re
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there: every connection is refused
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "0.json").write_text("".join(json.dumps({"body": f"b{i}"}) + "\n" for i in range(20)))
    deadline = 8
    df = spark.readStream.schema("body string").json(str(rows)).selectExpr("CAST(body AS BINARY) AS body")
    writer = df.writeStream.format("amqp").option("uri", f"{scheme}://guest:guest@127.0.0.1:{port}/")
    writer = writer.option("routingKey" if scheme == "amqp" else "stream", "nowhere").option("connectionTimeout", "2")
    began = time.monotonic()
    query = writer.option("brokerOutageTimeout", f"{deadline}s").option("checkpointLocation", str(tmp_path / "c")).start()
    try:
        assert wait_for(lambda: not query.isActive, timeout=180, interval=0.5)
        took = time.monotonic() - began
        error = str(query.exception())
        assert f"brokerOutageTimeout={deadline}s" in error and "nothing was published" in error, error[:3000]
        # The last attempt did not wait again: one or two refused connections (an attempt that waited the deadline
        # makes six, 0.2 s to 3.2 s apart). Counted, not timed: on a loaded machine Spark's own steps take longer,
        # and that only leaves a retry less of the deadline.
        retries = re.findall(r"still, after (\d+) attempt\(s\) over \d+s: this is Spark's retry of a task planned", error)
        assert retries and all(int(n) <= 3 for n in retries), error[:3000]
        print(f"\nthe {scheme} sink's query failed {took:.1f}s after it started (brokerOutageTimeout={deadline}s, 3 task attempts)")
    finally:
        query.stop()
