"""What ``tools/netfault isolate`` does to the real cluster, which the Spark partition test counts on: c3 cut off from
c1 and c2 while its clients are still served. The quorum queue it led elects a leader among c1 and c2, a publish
through c1 is confirmed, and once healed c3 follows the new leader. No Spark here."""

from __future__ import annotations

import json
import uuid

import pika
import pytest

from ..broker.helpers import wait_for
from .conftest import Cluster, _tool, silent_network_possible


@pytest.fixture(autouse=True)
def _can_drop_packets() -> None:
    why = silent_network_possible()
    if why:
        pytest.skip(why)


def _states(queue: str) -> dict[str, str]:
    members = json.loads(_tool("cli", "c1", "rabbitmq-queues", "quorum_status", queue, "--formatter", "json"))
    return {m["Node Name"].partition("@")[0]: m["Raft State"] for m in members}


def _connect(cluster: Cluster, name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{cluster.node(name).port}/%2F?socket_timeout=5&connection_attempts=1")
    return pika.BlockingConnection(params)


def test_a_node_cut_off_from_its_peers_still_serves_its_clients_while_the_majority_goes_on(cluster: Cluster) -> None:
    queue = f"partition.{uuid.uuid4().hex[:8]}"
    on_c3 = _connect(cluster, "c3")
    on_c3.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"})
    on_c3.close()
    assert _states(queue)["c3"] == "leader"
    try:
        with cluster.partitioned("c3"):
            assert wait_for(lambda: "leader" in (_states(queue).get("c1"), _states(queue).get("c2")), timeout=90, interval=1)
            conn = _connect(cluster, "c1")
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", queue, b"m", pika.BasicProperties(delivery_mode=2), mandatory=True)  # raises unless confirmed
            conn.close()
            still = _connect(cluster, "c3")  # c3 answers its clients: no pause_minority closing its listeners
            assert still.channel().is_open
            still.close()
        assert wait_for(lambda: _states(queue).get("c3") == "follower", timeout=120, interval=1), _states(queue)
    finally:
        cluster.delete(queue)
