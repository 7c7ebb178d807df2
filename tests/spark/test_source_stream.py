"""The source under Spark: exact counts, acks only after commit, failures, restarts. Both brokers."""

from __future__ import annotations

import datetime
import json
import threading
import time

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from ..broker.helpers import wait_for
from ..brokers import counts, publish
from .file_sink import rows_written
from .triggers import AVAILABLE_NOW_DRAINS, PYSPARK_LINE, run_to_the_end

pytestmark = pytest.mark.spark
PYSPARK_REPORTS_BACKLOG = PYSPARK_LINE >= (4, 2)


def _stream(spark, url: str, queue: str, **options: object):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("amqp").option("uri", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_round_trip_exactly_n_rows_and_every_field(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    full = pika.BasicProperties(
        content_type="application/octet-stream",
        content_encoding="identity",
        headers={"s": "v", "i": 5, "b": True, "nested": {"k": [1, 2]}},
        delivery_mode=2,
        priority=4,
        correlation_id="corr",
        reply_to="replies",
        expiration="600000",
        message_id="full",
        timestamp=1_700_000_000,
        type="kind",
        user_id="guest",
        app_id="tests",
    )
    big = bytes(range(256)) * 4096
    ch.basic_publish("", q, b"\x00\xffbinary", full)
    ch.basic_publish("", q, b"", pika.BasicProperties(message_id="empty"))
    ch.basic_publish("", q, big, pika.BasicProperties(message_id="big"))
    for i in range(297):
        ch.basic_publish("", q, b"m%d" % i, pika.BasicProperties(message_id=f"m{i}"))
    conn.close()

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = _stream(spark, amqp_url, q, maxMessagesPerTrigger=120)
    writer = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
    # The last batch is acked too (an AvailableNow run's is never committed by Spark).
    run_to_the_end(writer, lambda: len(rows_written(spark, out)) >= 300 and counts(amqp_url, q, embedded_or_none) == (0, 0))
    all_rows = rows_written(spark, out)
    rows = {r["message_id"]: r for r in all_rows}
    assert len(all_rows) == 300 and len(rows) == 300
    f = rows["full"]
    assert bytes(f["body"]) == b"\x00\xffbinary" and f["queue"] == q and f["exchange"] == "" and f["routing_key"] == q
    assert (f["content_type"], f["content_encoding"], f["correlation_id"], f["reply_to"]) == (
        "application/octet-stream",
        "identity",
        "corr",
        "replies",
    )
    assert (f["expiration"], f["type"], f["user_id"], f["app_id"], f["priority"], f["delivery_mode"]) == (
        "600000",
        "kind",
        "guest",
        "tests",
        4,
        2,
    )
    assert f["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20)
    assert f["headers"] == {"s": "v", "i": "5", "b": "true", "nested": '{"k":[1,2]}'}
    assert f["redelivered"] is False and f["delivery_tag"] >= 1
    assert bytes(rows["empty"]["body"]) == b"" and bytes(rows["big"]["body"]) == big


def test_failed_batch_is_not_acked_and_arrives_after_restart(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(60)], message_id=lambda i: f"id{i}")
    ckpt = tmp_path / "ckpt"

    def fail(batch_df, batch_id):  # type: ignore[no-untyped-def]
        if batch_df.count():
            raise RuntimeError("sink down")

    query = _stream(spark, amqp_url, q).writeStream.foreachBatch(fail).option("checkpointLocation", str(ckpt)).start()
    with pytest.raises(Exception, match="sink down"):
        query.awaitTermination(120)
    # The failed batch was never committed: every message is back in the queue, none acked.
    assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (60, 0), timeout=30)

    out = tmp_path / "out"
    query = (
        _stream(spark, amqp_url, q).writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt)).start()
    )
    try:
        wait_for(lambda: len(rows_written(spark, out)) >= 60, timeout=120, interval=1)
        # Every message acked: each batch that holds one is committed (acks come after the commit), so the
        # rows read after this are all there will be, duplicates included.
        wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=30)
        rows = rows_written(spark, out)
        assert sorted(r["message_id"] for r in rows) == sorted(f"id{i}" for i in range(60))
        assert all(r["redelivered"] for r in rows)
    finally:
        query.stop()


def _backlogs(query, queue: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The source's reported backlog (ready + prefetched) in each progress event that has one."""
    out = []
    for progress in query.recentProgress:
        latest = progress.sources[0].latestOffset if progress.sources else None
        if latest:
            entry = json.loads(latest)[queue]
            out.append(entry["ready"] + entry["prefetched"])
    return out


def test_idle_stream_acks_its_last_batch_and_reports_its_backlog(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(40)], message_id=lambda i: f"id{i}")
    out = tmp_path / "out"
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "200ms")
    query = (
        _stream(spark, amqp_url, q, maxMessagesPerTrigger=10)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "c"))
        .start()
    )
    try:
        wait_for(lambda: len(rows_written(spark, out)) >= 40, timeout=120, interval=0.5)
        # Nothing new arrives, so Spark never calls commit for the last batch; acks still happen.
        assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=15)
        assert query.isActive
        assert len(rows_written(spark, out)) == 40
        if PYSPARK_REPORTS_BACKLOG:  # Spark 4.2+ shows reportLatestOffset() in the progress
            assert wait_for(lambda: _backlogs(query, q)[-1:] == [0], timeout=30, interval=0.2)
            assert max(_backlogs(query, q)) > 0  # reported while the queue drained, then 0
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
        query.stop()


def test_several_queues_in_one_stream_including_quorum(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    classic, quorum = names.queue("classic"), names.queue("quorum")
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(classic)
    ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    publish(amqp_url, classic, [b"c"] * 25, declare=False, message_id=lambda i: f"c{i}")
    publish(amqp_url, quorum, [b"q"] * 35, declare=False, message_id=lambda i: f"q{i}")
    out = tmp_path / "out"
    df = _stream(spark, amqp_url, f"{classic},{quorum}")
    writer = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "c"))

    def done() -> bool:
        acked = counts(amqp_url, classic, embedded_or_none) == (0, 0) and counts(amqp_url, quorum, embedded_or_none) == (0, 0)
        return acked and len(rows_written(spark, out)) >= 60

    run_to_the_end(writer, done)
    rows = rows_written(spark, out)
    by_queue: dict[str, int] = {}
    for r in rows:
        by_queue[r["queue"]] = by_queue.get(r["queue"], 0) + 1
    assert by_queue == {classic: 25, quorum: 35}
    assert not any(r["redelivered"] for r in rows)


def test_available_now_on_this_pyspark_line(spark, amqp_url: str, names, embedded_or_none, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """4.2+: batches of at most maxMessagesPerTrigger until the queue is drained, all acked.
    4.0/4.1: Spark runs one batch and never commits it to the source, so nothing is acked
    and every message is back in the queue once the run ends (docs/pyspark-versions.md)."""
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(50)], message_id=lambda i: f"id{i}")
    query = (
        _stream(spark, amqp_url, q, maxMessagesPerTrigger=20)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180) and query.exception() is None
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert all(n <= 20 for n in batches)
    if AVAILABLE_NOW_DRAINS:
        assert sum(batches) == 50 and len(batches) >= 3
        assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=20)
    else:
        assert len(batches) <= 1
        assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (50, 0), timeout=20)


def test_bad_input_fails_the_query_with_a_clear_error(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=r"(?i)unknown option 'prefetchCount'; valid options are: .*prefetch"):
        _stream(spark, amqp_url, "q", prefetchCount=10)  # fails at load(), before any query starts
    query = (
        _stream(spark, amqp_url, "test.no.such.queue").writeStream.format("noop").option("checkpointLocation", str(tmp_path / "a")).start()
    )
    with pytest.raises(Exception, match=r"queue 'test.no.such.queue'.*404"):
        query.awaitTermination(120)
    q = names.queue()
    publish(amqp_url, q, [])
    query = (
        _stream(spark, amqp_url, q, password="wrong-secret")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "b"))
        .start()
    )
    with pytest.raises(Exception, match="refused the login of user 'guest'") as info:
        query.awaitTermination(120)
    assert "wrong-secret" not in str(info.value)


@pytest.mark.embedded_only
def test_password_never_reaches_plans_offsets_checkpoints_or_logs(spark, tmp_path, capsys, caplog) -> None:  # type: ignore[no-untyped-def]
    secret = "Sup3r-Secret-Pw"
    with EmbeddedBroker(user="svc", password=secret) as broker:
        publish(broker.url, "q", [b"x"] * 5)
        plain_uri = broker.url.replace(f"svc:{secret}@", "svc@")
        df = _stream(spark, plain_uri, "q", password=secret)
        df.explain(True)
        ckpt = tmp_path / "ckpt"
        query = df.writeStream.format("noop").option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
        assert query.awaitTermination(120) and query.exception() is None
        assert query.recentProgress and secret not in str(query.recentProgress)
        # A password inside the uri: Spark prints option values unless told to redact them.
        spark.conf.set("spark.sql.redaction.options.regex", "(?i)url|uri")
        try:
            _stream(spark, broker.url, "q").explain(True)
        finally:
            spark.conf.unset("spark.sql.redaction.options.regex")
        printed = capsys.readouterr()
        assert "amqp" in printed.out and secret not in printed.out + printed.err
        assert secret not in caplog.text
        files = [p for p in ckpt.rglob("*") if p.is_file()]
        assert any(p.parent.name == "offsets" for p in files)
        assert all(secret.encode() not in p.read_bytes() for p in files)


@pytest.mark.embedded_only
@pytest.mark.pinned  # the runtime answers the broker's basic.cancel: nothing here differs between PySpark lines (CI time)
def test_consumer_timeout_with_a_longer_trigger_interval(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(consumer_timeout_ms=2000) as broker:
        # As RabbitMQ 4.3: a quorum queue's consumer is timed out with basic.cancel (3.10-4.2 closed
        # the channel with 406; classic queues have no consumer timeout on 4.3).
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        publish(broker.url, "q", [b"m%d" % i for i in range(30)], declare=False, message_id=lambda i: f"id{i}")
        out = tmp_path / "out"
        query = (
            _stream(spark, broker.url, "q", maxMessagesPerTrigger=10, prefetch=20)
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "c"))
            .trigger(processingTime="4 seconds")
            .start()
        )
        try:
            wait_for(lambda: len(rows_written(spark, out)) >= 30, timeout=150, interval=1)
            wait_for(lambda: broker.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1}, timeout=30)
            rows = rows_written(spark, out)
            assert sorted(r["message_id"] for r in rows) == sorted(f"id{i}" for i in range(30))
        finally:
            query.stop()


@pytest.mark.embedded_only
@pytest.mark.pinned  # the runtime's reconnect: nothing here differs between PySpark lines (CI time)
def test_connection_dropped_mid_stream(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        publish(broker.url, "q", [])
        total = 600
        done = threading.Event()

        def producer() -> None:
            conn = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(total):
                ch.basic_publish("", "q", b"m", pika.BasicProperties(message_id=f"id{i}"))
                if i % 50 == 0:
                    time.sleep(0.2)
            conn.close()
            done.set()

        out = tmp_path / "out"
        query = (
            _stream(spark, broker.url, "q", maxMessagesPerTrigger=100, prefetch=300)
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "c"))
            .start()
        )
        try:
            wait_for(lambda: broker.queue_stats("q")["consumers"] == 1, timeout=120)
            threading.Thread(target=producer, daemon=True).start()
            for _ in range(3):
                time.sleep(1.5)  # spread the drops over the producer's run
                # after the previous drop the source may still be reconnecting: drop it once it is back
                wait_for(lambda: broker.drop_connections(name_contains="spark-amqp source") >= 1, timeout=60, interval=0.2)
            assert done.wait(120)
            wait_for(lambda: len(rows_written(spark, out)) >= total, timeout=120, interval=1)
            # Nothing ready or unacked: every batch that holds a message is committed (acks come after the commit),
            # redelivered copies included, so the rows read after this are all there will be.
            wait_for(lambda: broker.queue_stats("q")["unacked"] == 0 and broker.queue_stats("q")["ready"] == 0, timeout=30)
            ids = [r["message_id"] for r in rows_written(spark, out)]
            assert len(ids) == total and len(set(ids)) == total
        finally:
            query.stop()


@pytest.mark.embedded_only
def test_stopping_the_query_closes_the_consumer_cleanly(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        publish(broker.url, "q", [b"m%d" % i for i in range(50)])

        def slow(batch_df, batch_id):  # type: ignore[no-untyped-def]
            time.sleep(30)  # holds its batch (unacked) while the query is stopped

        query = _stream(spark, broker.url, "q").writeStream.foreachBatch(slow).option("checkpointLocation", str(tmp_path / "c")).start()
        wait_for(lambda: broker.queue_stats("q")["unacked"] == 50, timeout=120)
        query.stop()
        # The source closes its connection when Spark stops it (through stop() or SIGTERM;
        # tests/queues/test_runtime.py checks the handler), and the 50 unacked messages are back at once.
        # Closed, not dropped: a connection the broker only finds dead (missed heartbeats) ends "lost".
        wait_for(lambda: broker.queue_stats("q") == {"ready": 50, "unacked": 0, "consumers": 0}, timeout=60)
        ended = [how for name, how in broker.ended_connections() if name.startswith("spark-amqp source")]
        assert ended and set(ended) == {"closed by client"}, ended
