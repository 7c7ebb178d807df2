"""Every mode at once through a silent network on the real 3-node cluster: node c1's client ports drop every packet
(iptables DROP, no reset: ``tools/netfault``) for 30 s, and later for longer than ``brokerOutageTimeout``. c1 leads
the quorum queue and the stream read; the cluster's own traffic goes on, so c1 stays their leader.

- The queries whose uri names the three nodes notice the silence by their heartbeats, go to another node, and go
  on: none pauses as long as the deadline, and every id arrives exactly once (at least once for the AMQP sinks).
- A query whose uri names c1 alone waits out the 30 s silence and fails, saying so, once the long one passes its
  deadline, counted from the last answer it had: never later than the deadline and a connection attempt, and never
  stuck. On the default options too, where finding the silence alone takes two minutes of missed heartbeats.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..broker.helpers import wait_for
from ..cluster.conftest import Cluster, with_hosts
from .cluster_queries import EveryMode, Faults, Queries, assert_no_stall, cluster_to_ourselves, declare, preload

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

HEARTBEAT = 5  # seconds: a silence of two ends a connection
DEADLINE = 45  # brokerOutageTimeout, seconds: above the short silence and its detection
SHORT, LONG = 30, DEADLINE + 30  # the silences, seconds
# A query that cannot reach its node fails after the deadline, counted from the last answer it had (an idle
# connection's may be a heartbeat before the silence), once its last connection attempt (connectionTimeout) is over;
# the rest is Spark's next trigger and the machine's load.
EARLIEST_FAILURE, LATEST_FAILURE = DEADLINE - HEARTBEAT, DEADLINE + 5 + 15


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with cluster_to_ourselves(drops_packets=True) as found:
        yield found


class Silences(Faults):
    """c1 silent for SHORT seconds, then, after the queries have caught up a little, for LONG."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster

    def plan(self) -> None:
        time.sleep(4)
        with self.window("c1 silent for 30 s"), self.cluster.silenced("c1"):
            time.sleep(SHORT)
        time.sleep(10)
        with self.window(f"c1 silent for {LONG} s"), self.cluster.silenced("c1"):
            time.sleep(LONG)


def test_every_mode_through_a_silent_node(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    modes = EveryMode(cluster, "silent", uuid.uuid4().hex[:8])
    request.addfinalizer(modes.delete)
    alone = f"silent.alone.{modes.tag}"
    declare(cluster, "c2", alone, "quorum")
    request.addfinalizer(lambda: cluster.delete(alone))
    preload(cluster, alone, "a")
    c1_only = with_hosts(cluster.url, [f"127.0.0.1:{cluster.node('c1').port}"])
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    run = Queries(
        spark, tmp_path, modes.tag, heartbeat=str(HEARTBEAT), connectionTimeout="5", brokerOutageTimeout=f"{DEADLINE}s",
    )  # fmt: skip
    silences = Silences(cluster)
    ended: dict[str, float] = {}
    try:
        modes.start(run, cluster.url, cluster.stream_url or "")
        run.read("queue through c1 alone", c1_only, queue=alone, maxMessagesPerTrigger="20")
        assert wait_for(run.flowing, timeout=180, interval=1)
        silences.start()
        while silences.is_alive():  # when each query ends, if one does
            for name, query in run.running.items():
                if name not in ended and not query.isActive:
                    ended[name] = time.time()
            time.sleep(0.5)
        assert silences.error is None, silences.error
        short, long = silences.windows.values()
        wait_for(lambda: not run.running["queue through c1 alone"].isActive, timeout=LATEST_FAILURE, interval=0.5)
        ended.setdefault("queue through c1 alone", time.time())

        caught_up = wait_for(lambda: modes.caught_up(run, failing=("queue through c1 alone",)), timeout=300, interval=2)
        assert caught_up, modes.counts(run)
        assert_no_stall(run, silences.windows, DEADLINE, but=("queue through c1 alone",))
        alone_ended = ended["queue through c1 alone"] - long[0]
        print(f"the query through c1 alone failed {alone_ended:.1f} s into the long silence: {run.failed()}")
        # c1 alone: it waited out the short silence (batches after it), and failed on the long one, in time.
        assert ended["queue through c1 alone"] > short[1]
        error = run.failed()["queue through c1 alone"]
        assert f"brokerOutageTimeout={DEADLINE}s" in error and f"127.0.0.1:{cluster.node('c1').port}" in error, error
        assert EARLIEST_FAILURE <= alone_ended <= LATEST_FAILURE, alone_ended
        assert len(run.ids("queue through c1 alone")) > 0
    finally:
        run.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    modes.assert_delivered(spark, run)


# Defaults: brokerOutageTimeout 2 minutes, heartbeat 60 s, connectionTimeout 30 s.
OUTAGE, HEARTBEAT_DEFAULT, CONNECTION_TIMEOUT = 120, 60, 30
# Longer than brokerOutageTimeout plus the heartbeat: with the deadline counted from when a heartbeat gave up (two
# heartbeats of silence), a query would fail only after the silence ends, or never.
LONG_DEFAULT = OUTAGE + HEARTBEAT_DEFAULT + 20
# The latest a query may fail, counted from the silence's start: the deadline, the attempt in progress then, and Spark
# (its retries of a task past the deadline make one short attempt each, LAST_ATTEMPT), on a loaded machine.
LATEST = OUTAGE + CONNECTION_TIMEOUT + 20


def test_queries_on_a_silent_node_alone_fail_in_time_on_default_options(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    """Every mode's query, reading or writing through c1 alone with the default options, while c1 is silent for longer
    than brokerOutageTimeout plus the heartbeat. Each fails between brokerOutageTimeout and brokerOutageTimeout plus
    connectionTimeout after the silence began (the deadline counts from the last answer; the attempt in progress then
    ends): on RabbitMQ 4.3.6 the stream-protocol query once read on after 200 s of silence with no error. What each
    read wrote before is there once."""
    modes = EveryMode(cluster, "quiet", uuid.uuid4().hex[:8], read_on="c1", write_on="c1")
    request.addfinalizer(modes.delete)
    c1 = cluster.node("c1")
    amqp = with_hosts(cluster.url, [f"127.0.0.1:{c1.port}"])
    stream = with_hosts(cluster.stream_url or "", [f"127.0.0.1:{c1.stream_port}"])
    run = Queries(spark, tmp_path, modes.tag)  # the defaults but for the batch size
    silence = Silence(cluster)
    ended: dict[str, float] = {}
    try:
        modes.start(run, amqp, stream)
        assert wait_for(run.flowing, timeout=180, interval=1)
        silence.start()
        began = time.time()
        # When each query ends: through the silence, and for a while after it, so that a late failure is measured too.
        while (silence.is_alive() or time.time() < began + LATEST + 30) and len(ended) < len(run.running):
            for name, query in run.running.items():
                if name not in ended and not query.isActive:
                    ended[name] = time.time()
            time.sleep(0.5)
        silence.done(timeout=LONG_DEFAULT + 60)
        began = next(iter(silence.windows.values()))[0]
        into = {k: round(t - began, 1) for k, t in ended.items()}
        failed = run.failed()
        print(f"\nseconds into the silence each query failed at: {into}")
        assert set(into) == set(modes.names), (into, failed)
        # An idle connection's last answer may be a heartbeat up to half the heartbeat before the silence.
        late = {k: t for k, t in into.items() if not OUTAGE - HEARTBEAT_DEFAULT / 2 <= t <= LATEST}
        assert not late, late
        for name in failed:
            error = str(run.running[name].exception())  # whole: a Python worker's traceback comes first
            assert f"brokerOutageTimeout={OUTAGE}s" in error, (name, error[-2000:])
            assert f"127.0.0.1:{c1.port}" in error or f"127.0.0.1:{c1.stream_port}" in error, (name, error[-2000:])
        for name in modes.readers:
            written = run.ids(name)
            assert len(written) == len(set(written)) > 0, name
    finally:
        run.stop()


class Silence(Faults):
    """c1 silent for LONG_DEFAULT seconds."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster

    def plan(self) -> None:
        with self.window(f"c1 silent for {LONG_DEFAULT} s"), self.cluster.silenced("c1"):
            time.sleep(LONG_DEFAULT)
