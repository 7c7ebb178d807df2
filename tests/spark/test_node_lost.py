"""Every mode at once while a node of the 3-node cluster is lost for good and a fresh one takes its place: c3, which
leads the quorum queue and the stream read, is stopped, forgotten by the cluster (``forget_cluster_node``, which
takes it out of every queue's members) and its data deleted; then a fresh node c4 joins, and the quorum queues and
both streams grow a member onto it, mid-query. The queries' uri still names c1, c2 and c3, as a user's would until
it is changed; c4's stream members are reached at the address c4 advertises. Every id must arrive exactly once (at
least once for the AMQP sinks), and no query may pause as long as ``brokerOutageTimeout``. Afterwards c4 is lost in
turn and a fresh c3 joins: the cluster is c1, c2 and c3 again for the other tests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..broker.helpers import wait_for
from ..cluster.conftest import Cluster, _tool, cluster_lock
from .cluster_queries import EveryMode, Faults, Queries, assert_no_stall, whole_cluster

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

DEADLINE = 90  # brokerOutageTimeout, seconds


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    found = whole_cluster()
    with cluster_lock():
        try:
            yield found
        finally:  # the cluster as the other tests know it: c1, c2 and a fresh c3
            _tool("lose", "c4", timeout=300)
            _tool("start", "c3", timeout=300)


class NodeLost(Faults):
    def __init__(self, streams: tuple[str, ...]) -> None:
        super().__init__()
        self.streams = streams

    def plan(self) -> None:
        time.sleep(4)
        with self.window("c3 lost for good"):
            _tool("lose", "c3", timeout=300)
        time.sleep(6)
        with self.window("c4 joined, members grown onto it"):
            _tool("start", "c4", timeout=300)
            _tool("cli", "c1", "rabbitmq-queues", "grow", "c4@localhost", "all", timeout=300)
            for stream in self.streams:
                _tool("cli", "c1", "rabbitmq-streams", "add_replica", stream, "c4@localhost", timeout=300)


def test_every_mode_while_a_node_is_lost_for_good_and_replaced(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    modes = EveryMode(cluster, "lost", uuid.uuid4().hex[:8], read_on="c3")
    request.addfinalizer(modes.delete)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    run = Queries(
        spark, tmp_path, modes.tag, heartbeat="10", connectionTimeout="5", brokerOutageTimeout=f"{DEADLINE}s",
    )  # fmt: skip
    lost = NodeLost((modes.s, modes.out_s))
    try:
        modes.start(run, cluster.url, cluster.stream_url or "")
        assert wait_for(run.flowing, timeout=180, interval=1)
        lost.start()
        lost.done(timeout=600)

        assert wait_for(lambda: modes.caught_up(run), timeout=300, interval=2), modes.counts(run)
        print("\nwindows (s):", {k: round(b - a, 1) for k, (a, b) in lost.windows.items()})
        assert_no_stall(run, lost.windows, DEADLINE)
        for queue in (modes.q, modes.out_q, modes.out_q10):  # the quorum queues have a member on the new node, and none on the lost one
            members = _tool("cli", "c1", "rabbitmq-queues", "quorum_status", queue, "--formatter", "json")
            assert "c4@localhost" in members and "c3@localhost" not in members, (queue, members)
        for stream in (modes.s, modes.out_s):
            members = _tool("cli", "c1", "rabbitmq-streams", "stream_status", stream, "--formatter", "json")
            assert "c4@localhost" in members and "c3@localhost" not in members, (stream, members)
    finally:
        run.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    modes.assert_delivered(spark, run)
