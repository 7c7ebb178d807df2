"""Every mode at once through a real load balancer: HAProxy (Debian's package, ``tools/haproxy``) in TCP mode in front
of the 3-node cluster, one port for AMQP (0-9-1 and 1.0) and one for the stream protocol, round robin. Stream-protocol
queries set ``loadBalancer=true``: the nodes advertise their own ports, and a task connects through the balancer again
until it reaches a node that holds its stream (a publisher: the leader). Mid-query, HAProxy is stopped and started
again (every connection through it cut, 5 s with nothing listening), and then node c1 is taken out of its backends
(its sessions cut) for 20 s. c1 leads the quorum queue and the stream read, c2 what the stream sink writes. Every id
must arrive exactly once (at least once for the AMQP sinks).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..broker.helpers import wait_for
from ..brokers import TOOLS
from ..cluster.conftest import Cluster, cluster_lock
from .cluster_queries import EveryMode, Faults, Queries, assert_no_stall, whole_cluster

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

HAPROXY = TOOLS.parent / "haproxy"
DEADLINE = 60  # brokerOutageTimeout, seconds


def _haproxy(*args: str) -> str:
    return subprocess.run([str(HAPROXY), *args], check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    found = whole_cluster()
    if shutil.which("haproxy") is None:
        pytest.skip("HAProxy is not installed: tools/haproxy install")
    with cluster_lock():
        _haproxy("start")
        try:
            yield found
        finally:
            _haproxy("enable", "c1")
            _haproxy("start")


class BalancerFaults(Faults):
    def plan(self) -> None:
        time.sleep(4)
        with self.window("HAProxy stopped for 5 s and started"):
            _haproxy("stop")
            time.sleep(5)
            _haproxy("start")
        time.sleep(10)
        with self.window("c1 out of the backends for 20 s"):
            _haproxy("disable", "c1")
            time.sleep(20)
            _haproxy("enable", "c1")


def test_every_mode_through_haproxy_restarted_and_without_a_node(spark, cluster: Cluster, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    modes = EveryMode(cluster, "lb", uuid.uuid4().hex[:8])
    request.addfinalizer(modes.delete)
    amqp, stream = _haproxy("url"), _haproxy("stream-url")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    run = Queries(
        spark, tmp_path, modes.tag, heartbeat="10", connectionTimeout="5", brokerOutageTimeout=f"{DEADLINE}s",
    )  # fmt: skip
    faults = BalancerFaults()
    try:
        modes.start(run, amqp, stream, loadBalancer="true")
        assert wait_for(run.flowing, timeout=180, interval=1)
        faults.start()
        faults.done(timeout=300)

        assert wait_for(lambda: modes.caught_up(run), timeout=300, interval=2), modes.counts(run)
        assert_no_stall(run, faults.windows, DEADLINE)
    finally:
        run.stop()
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    modes.assert_delivered(spark, run)
