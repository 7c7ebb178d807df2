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

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..broker.helpers import wait_for
from ..cluster.conftest import Cluster, _tool, cluster_lock, hosts_of, with_hosts
from .cluster_queries import Faults, N, Queries, assert_once, batches_within, declare, drain_ids, pause, preload, whole_cluster
from .triggers import PYSPARK_LINE

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

# The queue's ids: those below FIRST are there before the queries start, those below LAST as the faults begin, the
# rest as the rolling restart begins, so that the queue query still has rows then (on a fast machine every query had
# read all it had before the restart: run ci56).
FIRST, LAST = 400, 1600


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    found = whole_cluster()
    with cluster_lock():
        yield found


class Failovers(Faults):
    """The cluster's faults, one after the other."""

    def __init__(self, cluster: Cluster, stream: str, queue: str) -> None:
        super().__init__()
        self.cluster, self.stream, self.queue = cluster, stream, queue

    def _down(self, what: str, node: str, seconds: float) -> None:
        with self.window(what):
            _tool("stop", node)
            time.sleep(seconds)
            _tool("start", node)

    def plan(self) -> None:  # the nodes are started again in the test's finally
        time.sleep(4)
        # The queue's other ids go in now, so that the queue query has rows to read while c1 is down however long
        # its start took: under load, starting every query one after the other once outlasted its first ids (ci51).
        preload(self.cluster, self.queue, "q", range(FIRST, LAST), via="c2")
        self._down("quorum queue's leader (c1) stopped", "c1", 12)
        self._down("stream's leader (c2) stopped", "c2", 12)
        with self.window("c3 drained"):
            _tool("cli", "c3", "rabbitmq-upgrade", "drain")
            time.sleep(10)
            _tool("cli", "c3", "rabbitmq-upgrade", "revive")
        with self.window("a replica deleted and added back"):
            _tool("cli", "c1", "rabbitmq-streams", "delete_replica", self.stream, "c1@localhost")
            time.sleep(6)
            _tool("cli", "c1", "rabbitmq-streams", "add_replica", self.stream, "c1@localhost")
        with self.window("rolling restart"):
            preload(self.cluster, self.queue, "q", range(LAST, N), via="c2")
            for node in ("c1", "c2", "c3"):
                _tool("stop", node)
                _tool("start", node)


def test_queries_and_sinks_go_on_through_failovers_a_drain_and_a_rolling_restart(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    q, s, solo, out_q, out_s = (f"fo.{k}.{tag}" for k in ("q", "s", "solo", "outq", "outs"))
    request.addfinalizer(lambda: cluster.delete(q, s, solo, out_q, out_s))  # whatever happens (EveryMode.delete)
    declare(cluster, "c1", q, "quorum")
    declare(cluster, "c2", s, "stream")
    declare(cluster, "c3", solo, "stream", **{"x-initial-cluster-size": 1})
    declare(cluster, "c1", out_q, "quorum")
    declare(cluster, "c1", out_s, "stream")
    preload(cluster, q, "q", range(FIRST))  # the rest as the faults begin (Failovers.plan)
    for queue, prefix in ((s, "s"), (solo, "o")):
        preload(cluster, queue, prefix)
    no_c3 = with_hosts(
        cluster.stream_url or "", [h for h in hosts_of(cluster.stream_url or "") if not h.endswith(f":{cluster.node('c3').stream_port}")]
    )
    # Every batch's progress is kept (Spark keeps 100): the fault windows are checked against them at the end.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    # Batches of 100 every 4 s (the other fault tests make 200 every 8 s): the outages here are 6-12 s, and the test
    # counts the batches each query made while c1 was down.
    run = Queries(spark, tmp_path, tag, "4 seconds", 100, connectionTimeout="5", brokerOutageTimeout="90s")
    run.read("queue", cluster.url, queue=q, journalLocation=str(tmp_path / "journal"))
    run.read("stream over the stream protocol", cluster.stream_url or "", stream=s)
    run.read("stream over AMQP 0-9-1", cluster.url, stream=s)
    run.read("stream with no member on the uri's nodes", no_c3, stream=solo)
    run.write("AMQP 0-9-1 sink", cluster.url, routingKey=out_q)
    run.write("stream sink", cluster.stream_url or "", stream=out_s)
    queries = run.running
    expected = {
        "queue": "q",
        "stream over the stream protocol": "s",
        "stream over AMQP 0-9-1": "s",
        "stream with no member on the uri's nodes": "o",
    }
    faults = Failovers(cluster, s, q)
    try:
        assert wait_for(run.flowing, timeout=180, interval=1)
        faults.start()
        faults.done(timeout=400)

        def read_all() -> bool:
            assert not run.failed(), run.failed()
            return all(sum(p.numInputRows for p in run.progress(k)) >= N for k in queries)  # as EveryMode.caught_up

        assert wait_for(read_all, timeout=300, interval=2), {k: len(run.ids(k)) for k in expected}
        # The queue query went on making batches while the node that led its queue was down (3 nodes in its uri).
        made = batches_within(run.progress("queue"), faults.windows["quorum queue's leader (c1) stopped"])
        print("\nfault windows:", {k: round(b - a, 1) for k, (a, b) in faults.windows.items()})
        print(
            "batches with rows while c1 was down:",
            {k: batches_within(run.progress(k), faults.windows["quorum queue's leader (c1) stopped"]) for k in queries},
        )
        for fault, window in faults.windows.items():
            print(f"longest pause between batches around '{fault}' (s):", {k: round(pause(run.progress(k), window), 1) for k in queries})
        late = {k: batches_within(run.progress(k), (faults.windows["rolling restart"][0], time.time())) for k in queries}
        print("batches with rows from the rolling restart on:", late)
        # The pauses printed for the queue query around c2, the drain and the replica include its wait for its last
        # ids, which come at the rolling restart: the input's, not the query's.
        assert made > 0 and late["queue"] > 0, (made, late)
    finally:
        run.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
        for node in ("c1", "c2", "c3"):
            _tool("start", node)
        _tool("cli", "c3", "rabbitmq-upgrade", "revive")
    for name, prefix in expected.items():
        assert_once(run.ids(name), prefix, name)
    reader = spark.read.format("amqp").option("uri", cluster.url).options(**cluster.stream_port())
    written = reader.option("stream", out_s).load().select("message_id").collect()
    assert_once([r["message_id"] for r in written], "k", "stream sink")  # deduplicated
    assert sorted(set(drain_ids(cluster, out_q))) == sorted(f"k{i}" for i in range(N))  # at least once


@pytest.mark.skipif(PYSPARK_LINE < (4, 2), reason="the outage shows in the progress from PySpark 4.2 (reportLatestOffset)")
def test_one_node_in_the_uri_stopped_fails_the_query_after_broker_outage_timeout(spark, cluster: Cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    q = f"fo.one.{tag}"
    declare(cluster, "c1", q, "quorum")
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
