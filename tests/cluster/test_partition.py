"""What ``tools/netfault isolate`` does to the real cluster, which the Spark partition test counts on: c3 cut off from
c1 and c2 while its clients are still served. The quorum queue it led elects a leader among c1 and c2, a publish
through c1 is confirmed, and once healed c3 follows the new leader. No Spark here."""

from __future__ import annotations

import collections
import json
import time
import uuid
from pathlib import Path

import pika
import pytest

from ..broker.helpers import wait_for
from ..queues.driver import MicroBatchDriver
from .conftest import Cluster, _tool, silent_network_possible, with_hosts

# The fault lane's (make test): no other lane touches the cluster.
pytestmark = pytest.mark.cluster


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


def _ready(cluster: Cluster, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of ``queue`` as the majority's leader counts them: a passive declare through c1,
    not rabbitmqctl (1.7 s of CPU a call)."""
    conn = _connect(cluster, "c1")
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


def _await_ready(cluster: Cluster, queue: str, ready: int, timeout: float, what: str, driver: MicroBatchDriver) -> None:
    """Until the queue has ``ready`` messages ready, the reader idle meanwhile (its acks go out as Spark's calls come)."""
    deadline = time.monotonic() + timeout
    while (found := _ready(cluster, queue))[0] != ready:
        assert time.monotonic() < deadline, f"{what}: {found[0]} ready, {found[1]} consumer(s), not {ready} ready"
        asked = time.monotonic()
        driver.idle_until(lambda: time.monotonic() - asked > 0.5, timeout=5)  # noqa: B023


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_journalled_reader_on_the_cut_off_node_reads_each_message_once_though_the_queue_sends_its_acked_ones_again(
    cluster: Cluster, tmp_path: Path, partitions: int
) -> None:
    """The majority takes the consumer on c3 for gone and, after the queue's consumer-disconnected timeout (60 s by
    default, 5 s here), returns what was checked out to it, acks it never applied included; after the heal the same
    channel gets those again, marked redelivered (``spark_amqp.queues.copies``). Each is dropped as a copy or takes its
    buffered original's place: every id once, nothing left in the queue. A second partition returns the copies of the
    first, read and acked in between, once more (seen in CI: 400 ids read twice before copies of copies were found)."""
    queue, n = f"partition.j.{uuid.uuid4().hex[:8]}", 400
    conn = _connect(cluster, "c3")
    ch = conn.channel()
    arguments = {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local", "x-consumer-disconnected-timeout": 5000}
    ch.queue_declare(queue, durable=True, arguments=arguments)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, b"m", pika.BasicProperties(message_id=f"m{i}", delivery_mode=2))
    conn.close()
    c3_only = with_hosts(cluster.url, [f"127.0.0.1:{cluster.node('c3').port}"])
    driver = MicroBatchDriver(c3_only, queue, journalLocation=tmp_path / "journal", maxMessagesPerTrigger=50, prefetch=100)
    try:  # the queue deleted whatever happens: a quorum queue a failed test leaves behind slows every later drain
        try:
            for cut in range(partitions):
                if cut == 0:
                    driver.drain(100)
                else:
                    driver.runtime.commit(driver.start)  # Spark's commit of the batch read during the last cut
                # A later cut comes while the copies the last one made wait in the buffer: read during the cut, their own
                # copies come after it.
                read = len(driver.rows)
                # Acked and proven, and the next deliveries in: the queue has a full prefetch window checked out to us.
                driver.idle_until(
                    lambda: len(driver.runtime.buffer) >= 50 and all(not led.acked for led in driver.runtime.ledgers.values()), timeout=60
                )
                # What was read is acked, a prefetch window is checked out to the reader, the rest ready.
                _await_ready(cluster, queue, n - read - 100, timeout=60, what=f"before cut {cut + 1}, {read} rows read", driver=driver)
                with cluster.partitioned("c3"):
                    # A new leader on c1 or c2 has returned what c3's consumer had: nothing checked out any more.
                    _await_ready(cluster, queue, n - read, timeout=120, what=f"in cut {cut + 1}, {read} rows read", driver=driver)
                    planned = driver.plan()  # from the buffer: journalled and acked through c3, which applies nothing now
                    assert planned is not None
                    driver.run_batch(*planned)
            rows = driver.drain(n, timeout=180)
            ids = collections.Counter(r["message_id"] for r in rows)
            assert sorted(ids) == sorted(f"m{i}" for i in range(n)), len(ids)
            assert max(ids.values()) == 1, [k for k, c in ids.items() if c > 1][:10]
            assert driver.runtime.intake.copies_dropped > 0, "the queue sent nothing again: the test proves nothing"
            driver.idle_until(lambda: all(led.settled(driver.runtime.committed_seq) for led in driver.runtime.ledgers.values()), timeout=60)
        finally:
            driver.close()
        # Every tag acked: what a closed consumer had not acked would be ready again once it is gone.
        assert wait_for(lambda: _ready(cluster, queue)[1] == 0, timeout=60, interval=1)
        assert _ready(cluster, queue)[0] == 0
    finally:
        cluster.delete(queue)
