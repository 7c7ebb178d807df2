"""Every mode at once on both sides of a network partition of the 3-node cluster: c3, which leads every queue and
stream of the test, is cut off from c1 and c2 but not from its clients (``tools/netfault isolate``: its own packets
dropped but for its client ports' replies), for PARTITION seconds (a side), then healed.

- The majority side: seven queries whose uri names the three nodes, as a user's would. The quorum queues elect a
  leader among c1 and c2; the streams' coordinator moves their writers once c3 is found down.
- The minority side: seven more whose uri names c3 alone, as a client that happened to be on c3. RabbitMQ 4.3 keeps
  serving clients there (with Khepri, partition handling is Raft's: no ``pause_minority`` closing listeners), but c3
  can commit nothing: its reads wait and its publishes get no confirm (or a nack).

Every id must arrive exactly once on either side (at least once for the AMQP sinks), no query may fail, and the test
prints each query's longest pause.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..broker.helpers import wait_for
from ..cluster.conftest import Cluster, with_hosts
from .cluster_queries import EveryMode, Queries, assert_no_stall, cluster_to_ourselves

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

PARTITION = {"majority": 45, "minority": 45}  # seconds
# The quorum queues to read return what a consumer on the cut-off node had checked out after this long, not after
# RabbitMQ's default of 60 s: within the cut, as the 90 s cut it replaces did (the test is 60 s shorter).
DISCONNECTED_TIMEOUT = {"x-consumer-disconnected-timeout": 10_000}  # ms
DEADLINE = 120  # brokerOutageTimeout, seconds
# The majority side goes on once c1 and c2 find c3 gone (net_ticktime, 15 s on tools/rabbitmq's nodes) and elect
# leaders, before the partition heals: its longest pause was 25-38 s here, 49-67 s in CI runs beside the other Spark
# lanes, and 73-103 s in one whose two cores were loaded more (every mode alike: the machine, not a mode). So the
# assertion is the issue's, as on the minority side: no stall reaches brokerOutageTimeout; the pauses are printed.


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with cluster_to_ourselves(drops_packets=True) as found:
        yield found


def test_every_mode_on_either_side_of_a_partition(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    majority = EveryMode(cluster, "part", tag, read_on="c3", write_on="c3", side="(majority)", **DISCONNECTED_TIMEOUT)
    minority = EveryMode(cluster, "part.c3", tag, read_on="c3", write_on="c3", side="(c3 alone)", **DISCONNECTED_TIMEOUT)
    request.addfinalizer(majority.delete)
    request.addfinalizer(minority.delete)
    c3 = cluster.node("c3")
    c3_amqp = with_hosts(cluster.url, [f"127.0.0.1:{c3.port}"])
    c3_stream = with_hosts(cluster.stream_url or "", [f"127.0.0.1:{c3.stream_port}"])
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    # The journalled queue query reaches c3 in about a third of the runs (the uri's nodes in random order): then the
    # cut outlasts the queue's consumer-disconnected timeout, and the queue can send its acked messages again on the
    # same channel, copies the source drops (tests/cluster/test_partition.py shows that every time, without Spark).
    run = Queries(spark, tmp_path, tag, heartbeat="10", connectionTimeout="5", brokerOutageTimeout=f"{DEADLINE}s")
    windows: dict[str, dict[str, tuple[float, float]]] = {}

    def partition(side: str) -> None:
        began = time.time()
        with cluster.partitioned("c3"):
            time.sleep(PARTITION[side])
        windows[side] = {f"c3 cut off for {PARTITION[side]} s": (began, time.time())}

    try:
        # One side at a time: queries of one application share its task slots (two here), and the minority side's
        # tasks, waiting on c3, would hold them all and stall the majority side's queries with them.
        majority.start(run, cluster.url, cluster.stream_url or "")
        assert wait_for(run.flowing, timeout=240, interval=1)
        partition("majority")
        minority.start(run, c3_amqp, c3_stream)
        assert wait_for(run.flowing, timeout=240, interval=1)
        partition("minority")

        assert wait_for(lambda: majority.caught_up(run) and minority.caught_up(run), timeout=400, interval=2), (
            majority.counts(run),
            minority.counts(run),
        )
        assert_no_stall(run, windows["majority"], DEADLINE, of=majority.names)
        assert_no_stall(run, windows["minority"], DEADLINE, of=minority.names)
    finally:
        run.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    majority.assert_delivered(spark, run)
    minority.assert_delivered(spark, run)
