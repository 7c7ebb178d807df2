"""Stream mode under Spark: parallel reads on executors, exact offsets, fewer and larger batches. Both brokers."""

from __future__ import annotations

import glob
import json
import os
import re
import time
import uuid
from pathlib import Path

import pika
import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from pyspark.sql import functions as F

from spark_amqp.streams.offset import mark_of
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.ranges import StreamRange

from ..broker.helpers import wait_for
from ..brokers import REAL, STREAM_URLS, version
from ..streams.helpers import (
    add_partition,
    counted,
    declare_stream,
    offsets_and_ids,
    options,
    publish,
    publish_compressed,
    super_stream,
)

pytestmark = [pytest.mark.spark, pytest.mark.streams]
PYSPARK_42 = tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 2)


def _meet(barrier: str, parties: int, timeout: float) -> None:
    """Arrive at a barrier shared by ``parties`` tasks; fails if they do not run at the same time."""
    Path(barrier, uuid.uuid4().hex).touch()
    deadline = time.monotonic() + timeout
    while len(os.listdir(barrier)) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(os.listdir(barrier))} of {parties} tasks ran at the same time")
        time.sleep(0.05)


def _tagger(barrier: str, parties: int):  # type: ignore[no-untyped-def]
    """A UDF giving each row "<task>:<position in the task>"; each task waits at the barrier first.

    Each task runs in a Python worker of its own while both run, so per-process state is per task."""
    state: dict[str, object] = {}

    def tag(offset: int) -> str:
        if "task" not in state:
            _meet(barrier, parties, 120)
            state["task"], state["seq"] = uuid.uuid4().hex, 0
        seq = int(state["seq"])  # type: ignore[call-overload]
        state["seq"] = seq + 1
        return f"{state['task']}:{seq}"

    return F.udf(tag, "string", useArrow=False)


def test_a_stream_is_read_in_parallel_tasks_each_in_offset_order(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 4000)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    out = tmp_path / "out"
    df = (
        spark.readStream.format("amqp")
        .option("uri", amqp_url)
        .option("stream", s)
        .option("numPartitions", "2")
        .load()
        .select("offset", "message_id", "queue", _tagger(str(barrier), 2)("offset").alias("tag"))
    )
    query = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "c"))
    query = query.trigger(availableNow=True).start()
    assert query.awaitTermination(240)
    assert query.exception() is None
    rows = pa.concat_tables([pq.read_table(f) for f in glob.glob(f"{out}/*.parquet")]).to_pylist()
    assert sorted((r["offset"], r["message_id"]) for r in rows) == [(i, f"m{i}") for i in range(4000)]
    assert {r["queue"] for r in rows} == {s}
    by_task: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        task, seq = r["tag"].split(":")
        by_task.setdefault(task, []).append((int(seq), r["offset"]))
    assert len(by_task) == 2 and len(os.listdir(barrier)) == 2
    for pairs in by_task.values():
        offsets = [o for _, o in sorted(pairs)]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # one contiguous range, in order
    # The checkpoint holds stream positions, the next offset to read, each with the mark of the message before it.
    logged = sorted((tmp_path / "c" / "offsets").glob("[0-9]*"))
    assert json.loads(logged[-1].read_text().splitlines()[-1]) == {s: [4000, mark_of(b"b3999")]}


def _progress_sources(query) -> list[tuple[int, object]]:  # type: ignore[no-untyped-def]
    """(rows, reported latest offset) of each progress event."""
    out = []
    for p in query.recentProgress:
        if p.sources:
            latest = p.sources[0].latestOffset
            out.append((p.numInputRows, json.loads(latest) if latest else None))
    return out


@pytest.mark.skipif(not PYSPARK_42, reason="the polls are observed through reportLatestOffset, shown from Spark 4.2")
def test_min_messages_per_trigger_holds_a_batch_back_until_enough_are_there(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 300)
    out = tmp_path / "out"
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    reader = spark.readStream.format("amqp").option("uri", amqp_url).option("stream", s)
    reader = reader.option("minMessagesPerTrigger", "500").option("maxTriggerDelay", "1h")
    query = reader.load().writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "c"))
    query = query.trigger(processingTime="100 milliseconds").start()
    try:
        # The first batch of a run goes at once, whatever its size.
        assert wait_for(lambda: sum(n for n, _ in _progress_sources(query)) == 300, timeout=120, interval=0.2)
        publish(amqp_url, s, 300, 200)
        # Spark polled the source at least twice while it had 200 new messages: no batch for them, and the
        # progress shows them as the lag.
        lagging = {s: {"end": 500, "behind": 200}}
        assert wait_for(lambda: [lo for _, lo in _progress_sources(query)].count(lagging) >= 2, timeout=60, interval=0.2)
        assert sum(n for n, _ in _progress_sources(query)) == 300
        publish(amqp_url, s, 500, 300)
        assert wait_for(lambda: sum(n for n, _ in _progress_sources(query)) == 800, timeout=120, interval=0.2)
        assert [n for n, _ in _progress_sources(query) if n] == [300, 500]
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
        query.stop()


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_the_sink_publishes_to_a_stream_as_to_any_queue(spark, amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    df = spark.range(500).selectExpr("CAST(CONCAT('w', id) AS BINARY) AS body", "CONCAT('id', id) AS message_id")
    df.write.format("amqp").option("uri", amqp_url).option("routingKey", s).mode("append").save()
    opts = options(amqp_url, s)
    p = StreamPlanner(opts)
    try:
        end = p.ends()[s]
    finally:
        p.close()
    assert end == 500
    rows = offsets_and_ids(opts, StreamRange(s, 0, end))
    assert sorted(m for _, m in rows) == sorted(f"id{i}" for i in range(500))


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_spark_read_of_a_stream_reads_its_bounds_and_refuses_a_queue(spark, amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 300)
    df = (
        spark.read.format("amqp")
        .option("uri", amqp_url)
        .option("stream", s)
        .option("startingOffsets", json.dumps({s: 100}))
        .option("endingOffsets", json.dumps({s: 250}))
        .option("numPartitions", "2")
        .load()
    )
    rows = [(r["offset"], r["message_id"], r["queue"]) for r in df.select("offset", "message_id", "queue").collect()]
    assert sorted(rows) == [(i, f"m{i}", s) for i in range(100, 250)]
    assert df.count() == 150  # a second read of the same bounds: the same rows
    # Nothing between the bounds: no rows, no error (PySpark reads a plan of no ranges with a stand-in partition, which
    # failed a bare assertion before).
    empty = spark.read.format("amqp").option("uri", amqp_url).option("stream", s).option("startingOffsets", "latest").load()
    assert empty.count() == 0
    q = names.queue("classic")
    with pytest.raises(Exception, match=rf"spark.read cannot read queue '{q}'.*trigger\(availableNow=True\)"):
        spark.read.format("amqp").option("uri", amqp_url).option("queue", q).load().collect()


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_a_schema_of_some_columns_reads_only_those_and_a_bad_one_fails_naming_the_column(spark, shared_embedded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """.schema("body BINARY, offset BIGINT"): a batch read and a streaming query get those two columns (what reaches
    Spark is checked against the declared schema by PySpark too). A schema that is not a subset fails the read naming
    the column: Spark calls no Python at load() when a schema is given, so at the first action, or the query's start."""
    url, s = shared_embedded.url, f"cols-{uuid.uuid4().hex[:10]}"
    declare_stream(url, s)
    publish(url, s, 0, 300)
    asked = "body BINARY, offset BIGINT"
    df = spark.read.format("amqp").schema(asked).option("uri", url).option("stream", s).option("numPartitions", "2").load()
    assert df.columns == ["body", "offset"]
    assert sorted((r["offset"], r["body"]) for r in df.collect()) == [(i, f"b{i}".encode()) for i in range(300)]
    out = tmp_path / "out"
    stream = spark.readStream.format("amqp").schema(asked).option("uri", url).option("stream", s).load()
    query = stream.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "c"))
    query = query.trigger(availableNow=True).start()
    assert query.awaitTermination(120) and query.exception() is None
    written = pa.concat_tables([pq.read_table(f) for f in glob.glob(f"{out}/*.parquet")])
    assert written.column_names == ["body", "offset"] and sorted(written.column("offset").to_pylist()) == list(range(300))
    with pytest.raises(Exception, match=r"column 'offset' must be BIGINT .*not INT"):
        spark.read.format("amqp").schema("body BINARY, offset INT").option("uri", url).option("stream", s).load().collect()
    # The source's own schema says TIMESTAMP_LTZ: a session that reads TIMESTAMP as TIMESTAMP_NTZ still reads every column.
    spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
    try:
        everything = spark.read.format("amqp").option("uri", url).option("stream", s).load()
        assert dict(everything.dtypes)["timestamp"] == "timestamp" and everything.count() == 300
    finally:
        spark.conf.unset("spark.sql.timestampType")
    bad = spark.readStream.format("amqp").schema("body BINARY, msg_id STRING").option("uri", url).option("stream", s).load()
    failed = bad.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "bad")).trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"column 'msg_id' is not a column of this source. A stream's columns"):
        failed.awaitTermination(120)


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_a_super_stream_written_by_key_and_read_back_filtered(spark, amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    name = names.queue("orders")
    for i in range(3):
        declare_stream(amqp_url, f"{name}-{i}")
    df = spark.range(600).selectExpr(
        "CAST(id AS STRING) AS body",
        "CONCAT('customer-', id % 7) AS partition_key",
        "ELT(CAST(id % 3 AS INT) + 1, 'eu', 'us', 'ap') AS filter_value",
    )
    df.write.format("amqp").option("uri", amqp_url).option("superStream", name).mode("append").save()
    read = spark.read.format("amqp").option("uri", amqp_url).option("superStream", name)
    everything = read.load().select(F.col("body").cast("string").alias("id"), "queue").collect()
    # Every customer's rows in one partition, the one RabbitMQ's Java client would pick (tests/sink/test_routing.py).
    by_customer: dict[int, set[str]] = {}
    for row in everything:
        by_customer.setdefault(int(row["id"]) % 7, set()).add(row["queue"])
    assert sorted(int(r["id"]) for r in everything) == list(range(600))
    assert all(len(partitions) == 1 for partitions in by_customer.values()) and len({p for ps in by_customer.values() for p in ps}) > 1
    if version(amqp_url) < (3, 13):
        with pytest.raises(Exception, match=r"option 'filter' needs RabbitMQ 3\.13"):
            read.option("filter", "eu").load().collect()
        return
    eu = read.option("filter", "eu").load().select(F.col("body").cast("string").alias("id")).collect()
    assert sorted(int(r["id"]) for r in eu) == list(range(0, 600, 3))


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_a_checkpoint_written_over_one_protocol_is_read_over_the_other(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same offsets over AMQP 0-9-1, over the stream protocol and (RabbitMQ 4.x) over AMQP 1.0: a query moves
    from one to the next on its checkpoint and reads every message once; spark.read over the stream protocol reads
    its bounds."""
    stream_url = STREAM_URLS.get(amqp_url)
    if stream_url is None:
        pytest.skip("this broker's stream protocol port is not known (AMQP_TEST_STREAM_BROKERS)")
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    out, checkpoint = tmp_path / "out", tmp_path / "c"

    def run(uri: str, **extra: str) -> None:
        df = spark.readStream.format("amqp").option("uri", uri).option("stream", s).option("numPartitions", "2").options(**extra).load()
        query = df.select("offset", "message_id", "body").writeStream.format("parquet").option("path", str(out))
        query = query.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        assert query.awaitTermination(240)
        assert query.exception() is None

    publish(amqp_url, s, 0, 2000)
    run(amqp_url)
    publish(amqp_url, s, 2000, 2000)
    run(stream_url)
    total = 4000
    if any(b.url == amqp_url for b in REAL) and version(amqp_url) >= (4, 0):  # on over AMQP 1.0 (RabbitMQ 4.x; not the embedded broker)
        publish(amqp_url, s, 4000, 2000)
        run(amqp_url, protocol="amqp1.0")
        total = 6000
    rows = pa.concat_tables([pq.read_table(f) for f in glob.glob(f"{out}/*.parquet")]).to_pylist()
    assert sorted((r["offset"], r["message_id"], r["body"]) for r in rows) == [(i, f"m{i}", f"b{i}".encode()) for i in range(total)]
    logged = sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    assert json.loads(logged[-1].read_text().splitlines()[-1]) == {s: [total, mark_of(f"b{total - 1}".encode())]}
    bounded = spark.read.format("amqp").option("uri", stream_url).option("stream", s)
    bounded = bounded.option("startingOffsets", json.dumps({s: 100})).option("endingOffsets", json.dumps({s: 250})).load()
    assert sorted(r["offset"] for r in bounded.select("offset").collect()) == list(range(100, 250))


@pytest.mark.skipif(not PYSPARK_42, reason="AvailableNow is a single batch on PySpark 4.0/4.1 (no SupportsTriggerAvailableNow)")
def test_scheduled_available_now_runs_read_every_partition_of_a_super_stream(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A super stream found by name (no superStreamPartitions) read by scheduled AvailableNow runs: the
    first reads every partition, the next reads a partition added in between from its first message
    (over the stream protocol where the broker's port is known: the partitions come from its
    ``partitions`` command there, by name over AMQP 0-9-1)."""
    base = super_stream(amqp_url, names, 3)
    out, checkpoint = tmp_path / "out", tmp_path / "c"

    def run(uri: str) -> None:
        df = spark.readStream.format("amqp").option("uri", uri).option("superStream", base).option("startingOffsets", "first")
        query = df.load().select("queue", "message_id").writeStream.format("parquet").option("path", str(out))
        query = query.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        assert query.awaitTermination(240)
        assert query.exception() is None

    def read() -> list[tuple[str, str]]:
        return sorted((r["queue"], r["message_id"]) for r in spark.read.parquet(str(out)).collect())

    run(amqp_url)
    assert read() == sorted((f"{base}-{i}", f"m{100 * i + j}") for i in range(3) for j in range(10 + i))
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    add_partition(conn.channel(), names, base, 3)
    conn.close()
    publish(amqp_url, f"{base}-3", 300, 13)
    run(STREAM_URLS.get(amqp_url, amqp_url))
    added = [(q, m) for q, m in read() if q == f"{base}-3"]
    assert added == sorted((f"{base}-3", f"m{300 + j}") for j in range(13))
    assert len(read()) == 10 + 11 + 12 + 13


@pytest.mark.pinned  # nothing here differs between PySpark lines (CI time)
def test_reads_that_cannot_check_what_amqp_did_not_deliver_fail_naming_the_port(spark, amqp_url: str, names, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stream of compressed sub-entries only (a stream client's batching), read over AMQP 0-9-1 while nothing answers
    on the stream protocol's port, which alone tells them from offsets that hold no message: a batch read and an
    availableNow run fail within brokerOutageTimeout, naming the stream, the port and option streamPort. On RabbitMQ
    4.3.6 the run used to end "successfully" with 0 of 2,000 rows, the batch read with a bare AssertionError."""
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish_compressed(STREAM_URLS[amqp_url], s, 0, 2000)
    counted(amqp_url, s, 1)  # a count of 0 is taken for an empty stream (it lags a write by up to 5 s)
    options = {"uri": amqp_url, "stream": s, "streamPort": "1", "brokerOutageTimeout": "20s", "startingOffsets": "first"}
    explained = rf"(?s)stream '{s}': the messages of its last chunk.*127\.0\.0\.1:1.*option 'streamPort'"
    started = time.monotonic()
    with pytest.raises(Exception, match=explained):
        spark.read.format("amqp").options(**options).load().count()
    assert time.monotonic() - started < 20 + 30  # the deadline, then Spark's own time on a loaded machine

    query = (
        spark.readStream.format("amqp").options(**options).load()
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    failure: Exception | None = None
    try:
        ended = query.awaitTermination(120)
    except Exception as err:  # the query's own error: what it says is checked below
        failure = err
    finally:
        query.stop()
    assert failure is not None, f"the run {'ended' if ended else 'went on'} without an error: {query.lastProgress}"
    assert re.search(explained, str(failure)), failure
