"""Queries and sinks through failovers on a real 3-node RabbitMQ 4.3 cluster, under Spark, with unique ids.

One run, several queries at once (CI time): a journalled queue query on a quorum queue, a stream read over
each protocol, a stream with no member on the uri's nodes, and the two sinks (AMQP 0-9-1 into a quorum
queue, the stream protocol into a stream), while the cluster goes through: the quorum queue's leader
stopped, the stream's leader stopped, a node drained (maintenance mode), a replica deleted and added back,
and a rolling restart of all three. Each outage is 6-12 s. Then every id must be there exactly once (at
least once for the AMQP sink). A second test names one node only: the query fails after
brokerOutageTimeout, saying so, and its progress showed the outage meanwhile.
"""

from __future__ import annotations

import collections
import datetime
import glob
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from ..broker.helpers import wait_for
from ..cluster.conftest import Cluster, _tool, cluster_lock, find_cluster, hosts_of, with_hosts
from .triggers import PYSPARK_LINE

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.timeout(900)]

N = 3000
BATCH = "100"  # 30 batches every 2 s: the reads span the whole sequence of faults (about 70 s)
TRIGGER = "2 seconds"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    found = find_cluster()
    if found.stream_url is None or len(found.nodes) < 3:
        pytest.skip("needs AMQP_TEST_CLUSTER_STREAM_URL and the three nodes tools/rabbitmq runs")
    with cluster_lock():
        yield found


def _channel(cluster: Cluster, node: str) -> Any:
    return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{cluster.node(node).port}/%2F")).channel()


def _declare(cluster: Cluster, on: str, name: str, kind: str, **arguments: object) -> None:
    ch = _channel(cluster, on)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind, "x-queue-leader-locator": "client-local", **arguments})
    ch.connection.close()


def _preload(cluster: Cluster, queue: str, prefix: str) -> None:
    ch = _channel(cluster, "c1")
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", queue, f"{prefix}{i}".encode(), pika.BasicProperties(message_id=f"{prefix}{i}", delivery_mode=2))
    ch.connection.close()


def _ids(spark, path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    if not glob.glob(f"{path}/*.parquet"):
        return []
    return [r["message_id"] for r in spark.read.parquet(str(path)).select("message_id").collect()]


class Faults:
    """The cluster's faults, one after the other in a thread, each window recorded (epoch seconds)."""

    def __init__(self, cluster: Cluster, stream: str) -> None:
        self.cluster, self.stream = cluster, stream
        self.windows: dict[str, tuple[float, float]] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _down(self, what: str, node: str, seconds: float) -> None:
        began = time.time()
        _tool("stop", node)
        time.sleep(seconds)
        _tool("start", node)
        self.windows[what] = (began, time.time())

    def _run(self) -> None:
        try:
            time.sleep(6)
            self._down("quorum queue's leader (c1) stopped", "c1", 12)
            self._down("stream's leader (c2) stopped", "c2", 12)
            began = time.time()
            _tool("cli", "c3", "rabbitmq-upgrade", "drain")
            time.sleep(10)
            _tool("cli", "c3", "rabbitmq-upgrade", "revive")
            self.windows["c3 drained"] = (began, time.time())
            began = time.time()
            _tool("cli", "c1", "rabbitmq-streams", "delete_replica", self.stream, "c1@localhost")
            time.sleep(6)
            _tool("cli", "c1", "rabbitmq-streams", "add_replica", self.stream, "c1@localhost")
            self.windows["a replica deleted and added back"] = (began, time.time())
            began = time.time()
            for node in ("c1", "c2", "c3"):
                _tool("stop", node)
                _tool("start", node)
            self.windows["rolling restart"] = (began, time.time())
        except BaseException as err:  # the test reports it; the nodes are started again in its finally
            self.error = err


def _pause(query: Any, window: tuple[float, float]) -> float:
    """The longest time without a batch with rows around ``window``: from the last batch that began before
    a gap to the first after it, over the gaps that overlap the window."""
    began, ended = window
    starts = sorted(
        datetime.datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp() for p in query.recentProgress if p.numInputRows
    )
    gaps = [b - a for a, b in itertools.pairwise(starts) if b >= began and a <= ended]
    return max(gaps, default=0.0)


def _batches_within(query: Any, window: tuple[float, float]) -> int:
    began, ended = window
    count = 0
    for progress in query.recentProgress:
        at = datetime.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        if progress.numInputRows and began <= at <= ended:
            count += 1
    return count


def test_queries_and_sinks_go_on_through_failovers_a_drain_and_a_rolling_restart(spark, cluster: Cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    q, s, solo, out_q, out_s = (f"fo.{k}.{tag}" for k in ("q", "s", "solo", "outq", "outs"))
    _declare(cluster, "c1", q, "quorum")
    _declare(cluster, "c2", s, "stream")
    _declare(cluster, "c3", solo, "stream", **{"x-initial-cluster-size": 1})
    _declare(cluster, "c1", out_q, "quorum")
    _declare(cluster, "c1", out_s, "stream")
    for queue, prefix in ((q, "q"), (s, "s"), (solo, "o")):
        _preload(cluster, queue, prefix)
    source_dir = tmp_path / "rows"
    source_dir.mkdir()
    for f in range(30):
        rows = (json.dumps({"body": f"k{f * 100 + i}", "message_id": f"k{f * 100 + i}"}) + "\n" for i in range(100))
        (source_dir / f"{f}.json").write_text("".join(rows))
    common = {"connectionTimeout": "5", "brokerOutageTimeout": "90s", "maxMessagesPerTrigger": BATCH}
    no_c3 = with_hosts(
        cluster.stream_url or "", [h for h in hosts_of(cluster.stream_url or "") if not h.endswith(f":{cluster.node('c3').stream_port}")]
    )

    def read(name: str, uri: str, **options: str) -> Any:
        df = spark.readStream.format("amqp").option("uri", uri).options(**common, **options).load().select("message_id")
        writer = (
            df.writeStream.format("parquet").option("path", str(tmp_path / name)).option("checkpointLocation", str(tmp_path / f"c-{name}"))
        )
        return writer.trigger(processingTime=TRIGGER).queryName(f"failover-{name}-{tag}").start()

    def write(name: str, uri: str, **options: str) -> Any:
        rows = spark.readStream.schema("body string, message_id string").option("maxFilesPerTrigger", 1).json(str(source_dir))
        writer = rows.selectExpr("CAST(body AS BINARY) AS body", "message_id").writeStream.format("amqp").option("uri", uri)
        writer = writer.options(connectionTimeout="5", **options).option("checkpointLocation", str(tmp_path / f"c-{name}"))
        return writer.trigger(processingTime=TRIGGER).queryName(f"failover-{name}-{tag}").start()

    # Every batch's progress is kept (Spark keeps 100): the fault windows are checked against them at the end.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    queries = {
        "queue": read("queue", cluster.url, queue=q, journalLocation=str(tmp_path / "journal")),
        "stream over the stream protocol": read("stream-protocol", cluster.stream_url or "", stream=s),
        "stream over AMQP 0-9-1": read("stream-amqp", cluster.url, stream=s),
        "stream with no member on the uri's nodes": read("solo", no_c3, stream=solo),
        "AMQP 0-9-1 sink": write("sink-amqp", cluster.url, routingKey=out_q),
        "stream sink": write("sink-stream", cluster.stream_url or "", stream=out_s),
    }
    paths = {"queue": "queue", "stream over the stream protocol": "stream-protocol", "stream over AMQP 0-9-1": "stream-amqp"}
    paths["stream with no member on the uri's nodes"] = "solo"
    expected = {
        "queue": "q",
        "stream over the stream protocol": "s",
        "stream over AMQP 0-9-1": "s",
        "stream with no member on the uri's nodes": "o",
    }
    faults = Faults(cluster, s)
    try:
        faults.thread.start()
        faults.thread.join(timeout=400)
        assert faults.error is None and not faults.thread.is_alive(), faults.error

        def read_all() -> bool:
            failed = [k for k, query in queries.items() if query.exception() is not None]
            assert not failed, {k: str(queries[k].exception())[:2000] for k in failed}
            sunk = all(sum(p.numInputRows for p in query.recentProgress) >= N for k, query in queries.items() if "sink" in k)
            return sunk and all(len(_ids(spark, tmp_path / paths[k])) >= N for k in paths)

        assert wait_for(read_all, timeout=300, interval=2), {k: len(_ids(spark, tmp_path / p)) for k, p in paths.items()}
        # The queue query went on making batches while the node that led its queue was down (3 nodes in its uri).
        made = _batches_within(queries["queue"], faults.windows["quorum queue's leader (c1) stopped"])
        print("\nfault windows:", {k: round(b - a, 1) for k, (a, b) in faults.windows.items()})
        print(
            "batches with rows while c1 was down:",
            {k: _batches_within(qy, faults.windows["quorum queue's leader (c1) stopped"]) for k, qy in queries.items()},
        )
        for fault, window in faults.windows.items():
            print(f"longest pause between batches around '{fault}' (s):", {k: round(_pause(qy, window), 1) for k, qy in queries.items()})
        late = {k: _batches_within(qy, (faults.windows["rolling restart"][0], time.time())) for k, qy in queries.items()}
        print("batches with rows from the rolling restart on:", late)
        assert made > 0
    finally:
        for query in queries.values():
            query.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
        for node in ("c1", "c2", "c3"):
            _tool("start", node)
        _tool("cli", "c3", "rabbitmq-upgrade", "revive")
    for name, path in paths.items():
        counted = collections.Counter(_ids(spark, tmp_path / path))
        prefix = expected[name]
        assert sorted(counted) == sorted(f"{prefix}{i}" for i in range(N)), name
        assert max(counted.values()) == 1, (name, [k for k, c in counted.items() if c > 1][:10])
    written = spark.read.format("amqp").option("uri", cluster.url).option("stream", out_s).load().select("message_id").collect()
    counted = collections.Counter(r["message_id"] for r in written)
    assert sorted(counted) == sorted(f"k{i}" for i in range(N)) and max(counted.values()) == 1  # deduplicated
    ch = _channel(cluster, "c1")
    got = collections.Counter()
    while True:
        method, props, _ = ch.basic_get(out_q, auto_ack=True)
        if method is None:
            break
        got[props.message_id] += 1
    ch.connection.close()
    assert sorted(got) == sorted(f"k{i}" for i in range(N))  # at least once
    cluster.delete(q, s, solo, out_q, out_s)


@pytest.mark.skipif(PYSPARK_LINE < (4, 2), reason="the outage shows in the progress from PySpark 4.2 (reportLatestOffset)")
def test_one_node_in_the_uri_stopped_fails_the_query_after_broker_outage_timeout(spark, cluster: Cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    q = f"fo.one.{tag}"
    _declare(cluster, "c1", q, "quorum")
    only_c3 = with_hosts(cluster.url, [f"127.0.0.1:{cluster.node('c3').port}"])
    df = spark.readStream.format("amqp").option("uri", only_c3).option("queue", q).option("connectionTimeout", "3")
    query = df.option("brokerOutageTimeout", "15s").load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
    query = query.trigger(processingTime="1 second").start()
    try:
        assert wait_for(lambda: query.lastProgress is not None, timeout=60)
        began = time.monotonic()
        _tool("stop", "c3")
        shown = []

        def ended() -> bool:
            progress = query.lastProgress
            latest = progress["sources"][0].get("latestOffset") if progress and progress["sources"] else None
            if latest and "outage" in latest:
                shown.append(json.loads(latest)["outage"])
            return not query.isActive

        assert wait_for(ended, timeout=90, interval=0.5)
        took = time.monotonic() - began
        error = str(query.exception())
        assert "brokerOutageTimeout=15s" in error and f"127.0.0.1:{cluster.node('c3').port}" in error, error[:2000]
        assert 15 <= took < 60, took
        assert shown and shown[-1]["seconds"] >= 1, shown
        print(f"\nthe query failed {took:.1f}s after its only node stopped; its progress showed {shown[-1]}")
    finally:
        query.stop()
        _tool("start", "c3")
        cluster.delete(q)
