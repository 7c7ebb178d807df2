"""Over the stream protocol a stream is read on a node that holds one of its members: readers ask `metadata`
and connect to a replica (else the leader) at the address it advertises, follow the stream when its member
goes, and behind a load balancer connect through the uri until they reach such a node. On the real 3-node
cluster; no Spark here."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator

import pika
import pyarrow as pa
import pytest

from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.routing import partition_of
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.stream_protocol.client import StreamClient
from spark_amqp.stream_protocol.topology import connect_to_leader, connect_to_member, members, node_of
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange
from spark_amqp.transport.options import ConnectionOptions

from .conftest import Cluster, _tool, hosts_of, with_hosts

# The fault lane's (make test): no other lane touches the cluster.
pytestmark = pytest.mark.cluster

MESSAGES = 500


def _declare(cluster: Cluster, on: str, name: str, size: int) -> None:
    """A stream of MESSAGES messages whose leader is on node ``on``, with ``size`` members."""
    node = cluster.node(on)
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"))
    ch = conn.channel()
    arguments = {"x-queue-type": "stream", "x-queue-leader-locator": "client-local", "x-initial-cluster-size": size}
    ch.queue_declare(name, durable=True, arguments=arguments)
    ch.confirm_delivery()
    for i in range(MESSAGES):
        ch.basic_publish("", name, f"b{i}".encode(), pika.BasicProperties(message_id=f"m{i}"))
    conn.close()


@pytest.fixture
def stream_only_on_c1(cluster: Cluster, stream_url: str) -> Iterator[str]:
    name = f"members-{uuid.uuid4().hex[:8]}"
    _declare(cluster, "c1", name, 1)
    yield name
    cluster.delete(name)


@pytest.fixture
def replicated_stream(cluster: Cluster, stream_url: str) -> Iterator[str]:
    name = f"members-{uuid.uuid4().hex[:8]}"
    _declare(cluster, "c1", name, 3)
    yield name
    cluster.delete(name)


def _without(stream_url: str, cluster: Cluster, name: str) -> str:
    """The cluster's stream uri without node ``name``."""
    port = cluster.node(name).stream_port
    return with_hosts(stream_url, [h for h in hosts_of(stream_url) if not h.endswith(f":{port}")])


def _offsets(uri: str, stream: str, **extra: str) -> list[int]:
    opts = parse_stream_options({"uri": uri, "stream": stream, "connectionTimeout": "5", **extra})
    return [o for b in read_range(opts, StreamRange(stream, 0, MESSAGES)) for o in b.column("offset").to_pylist()]


def test_a_stream_with_no_member_on_the_uris_nodes_is_planned_and_read_where_it_lives(
    cluster: Cluster, stream_url: str, stream_only_on_c1: str
) -> None:
    """Before, every subscription went through the uri's node: 0x06 'stream not available' after 30 s."""
    uri = _without(stream_url, cluster, "c1")
    began = time.monotonic()
    planner = StreamPlanner(parse_stream_options({"uri": uri, "stream": stream_only_on_c1, "startingOffsets": "first"}))
    try:
        start = planner.initial_offset()
        end = planner.latest_offset(start.to_json(), None, True)
        assert end.get(stream_only_on_c1) == MESSAGES
        ranges = planner.partitions(start.to_json(), end.to_json())
    finally:
        planner.close()
    assert [(r.start, r.end) for r in ranges] == [(0, MESSAGES)]
    assert _offsets(uri, stream_only_on_c1) == list(range(MESSAGES))
    assert time.monotonic() - began < 10


def test_a_reader_goes_to_a_replica(cluster: Cluster, stream_url: str, replicated_stream: str) -> None:
    opts = parse_stream_options({"uri": stream_url, "stream": replicated_stream}).connection

    async def main() -> set[object]:
        reached = set()
        for _ in range(6):
            client = await connect_to_member(opts, replicated_stream, "spark-amqp test members")
            found = (await members(client, replicated_stream))[replicated_stream]
            here = node_of(client)
            assert here in found.all and here != found.leader, (here, found)
            reached.add(here)
            await client.close()
        return reached

    assert len(asyncio.run(main())) >= 1


def test_a_reader_follows_its_stream_when_its_replica_is_deleted(cluster: Cluster, stream_url: str, replicated_stream: str) -> None:
    """`rabbitmq-streams delete_replica` under a reader: the broker ends its subscription (a metadata update), and
    the reader resumes on a node that still holds the stream, reading every message once."""
    opts = parse_stream_options({"uri": stream_url, "stream": replicated_stream, "connectionTimeout": "5"})
    probe = asyncio.run(_reached(opts.connection, replicated_stream))
    victim = next(n for n in cluster.nodes if n.stream_port == probe)
    node = f"{victim.name}@localhost"
    batches = read_range(opts, StreamRange(replicated_stream, 0, MESSAGES), 50)
    got = list(next(batches).column("offset").to_pylist())
    try:
        _tool("cli", "c1", "rabbitmq-streams", "delete_replica", replicated_stream, node)
        got += [o for b in batches for o in b.column("offset").to_pylist()]
    finally:
        try:
            _tool("cli", "c1", "rabbitmq-streams", "add_replica", replicated_stream, node)
        except subprocess.CalledProcessError:
            pass  # the test's verdict stands; the stream is deleted anyway
    assert got == list(range(MESSAGES))


async def _reached(options: ConnectionOptions, stream: str) -> int:
    """The stream port of the node a reader of ``stream`` reaches (the connection is closed again)."""
    client = await connect_to_member(options, stream, "spark-amqp test members")
    here = node_of(client)
    await client.close()
    assert here is not None
    return here.port


def test_behind_a_load_balancer_readers_connect_through_the_uri_until_they_reach_the_stream(
    cluster: Cluster, stream_url: str, stream_only_on_c1: str
) -> None:
    """The cluster's uri stands for a load balancer (each connection lands on a node of its walk): with
    loadBalancer=true a reader reconnects through it until it is on c1, never at c1's advertised address; through
    a 'balancer' that never forwards to c1, it says so."""
    assert _offsets(stream_url, stream_only_on_c1, loadBalancer="true") == list(range(MESSAGES))

    async def reached() -> set[int | None]:  # a connection lands on c1 one time in 3: never give up too soon
        opts = parse_stream_options({"uri": stream_url, "stream": stream_only_on_c1, "loadBalancer": "true"}).connection
        ports = set()
        for _ in range(30):  # with 5 tries per member, 30 readers all reached c1 with odds of 1.5% ((1 - (2/3)^5)^30)
            client = await connect_to_member(opts, stream_only_on_c1, "spark-amqp test members")
            ports.add(None if node_of(client) is None else node_of(client).port)  # type: ignore[union-attr]
            await client.close()
        return ports

    assert asyncio.run(reached()) == {cluster.node("c1").stream_port}
    opts = parse_stream_options({"uri": _without(stream_url, cluster, "c1"), "stream": stream_only_on_c1, "loadBalancer": "true"})
    with pytest.raises(Exception, match=r"reached none of the nodes that hold it"):
        asyncio.run(connect_to_member(opts.connection, stream_only_on_c1, "spark-amqp test members"))


def test_a_publisher_goes_to_the_streams_leader(cluster: Cluster, stream_url: str, replicated_stream: str) -> None:
    """Publishing through another node is forwarded to the leader, at a third of the rate (measured: 131k against
    367k msg/s): the sink connects to the leader, directly or, behind a load balancer, through the uri."""

    async def main(extra: dict[str, str]) -> set[int]:
        opts = parse_stream_options({"uri": stream_url, "stream": replicated_stream, **extra}).connection
        reached = set()
        for _ in range(6):
            client = await connect_to_leader(opts, replicated_stream, "spark-amqp test members")
            found = (await members(client, replicated_stream))[replicated_stream]
            here = node_of(client)
            assert here is not None and here == found.leader, (here, found)
            reached.add(here.port)
            await client.close()
        return reached

    leader_port = cluster.node("c1").stream_port  # declared there, client-local
    assert asyncio.run(main({})) == {leader_port}
    assert asyncio.run(main({"loadBalancer": "true"})) == {leader_port}


def test_a_super_stream_is_published_on_each_partitions_leader(cluster: Cluster, stream_url: str) -> None:
    """A super stream's partitions lead on several nodes: the sink opens one connection per leader node (through
    one node, two thirds of the partitions would be forwarded), and behind a load balancer publishes through one."""
    name = f"members-super-{uuid.uuid4().hex[:8]}"
    partitions = [f"{name}-{i}" for i in range(3)]
    for node, partition in zip(("c1", "c2", "c3"), partitions, strict=True):
        _declare(cluster, node, partition, 3)
    used: list[list[int | None]] = []
    original = StreamPartitionPublisher._connections

    def connections(self: StreamPartitionPublisher) -> list[StreamClient]:
        if len(self._via) == 3:
            used.append([None if node_of(c) is None else node_of(c).port for c in self._via])  # type: ignore[union-attr]
        return original(self)

    keys = [f"k{i}" for i in range(300)]
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(StreamPartitionPublisher, "_connections", connections)
            for extra in ({}, {"loadBalancer": "true"}):
                opts = parse_sink_options({"uri": stream_url, "superStream": name, **extra})
                table = pa.RecordBatch.from_pydict({"body": [k.encode() for k in keys], "partition_key": keys})
                done = asyncio.run(StreamPartitionPublisher(opts, producer_for(f"q-{uuid.uuid4().hex}", 0, 0)).publish([table]))
                assert done.confirmed == len(keys)
        leaders = [cluster.node(n).stream_port for n in ("c1", "c2", "c3")]
        assert used[0] == leaders, used
        assert len(set(used[-1])) == 1, used  # load balancer mode: one connection
        for i, partition in enumerate(partitions):
            want = [k for k in keys if partition_of(k, 3) == i]
            got = [
                o
                for b in read_range(
                    parse_stream_options({"uri": stream_url, "stream": partition}), StreamRange(partition, 0, MESSAGES + 2 * len(want))
                )
                for o in b.column("body").to_pylist()
            ]
            assert got[MESSAGES:] == [k.encode() for k in want * 2], partition  # each run wrote its rows once
    finally:
        cluster.delete(*partitions)


def test_a_super_stream_led_elsewhere_leaves_no_connection_open(cluster: Cluster, stream_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first connection learns the partitions; when it leads none of them it is closed at once, and every
    connection is closed when the partition is written."""
    name = f"members-super-{uuid.uuid4().hex[:8]}"
    _declare(cluster, "c1", f"{name}-0", 3)
    made: list[StreamClient] = []
    original = StreamClient.connect.__func__  # type: ignore[attr-defined]

    async def connect(cls: type[StreamClient], *args: object) -> StreamClient:
        client = await original(cls, *args)
        made.append(client)
        return client

    monkeypatch.setattr(StreamClient, "connect", classmethod(connect))
    try:
        opts = parse_sink_options({"uri": _without(stream_url, cluster, "c1"), "superStream": name})
        table = pa.RecordBatch.from_pydict({"body": [b"x"] * 50, "partition_key": ["k"] * 50})
        done = asyncio.run(StreamPartitionPublisher(opts, producer_for(f"q-{uuid.uuid4().hex}", 0, 0)).publish([table]))
        assert done.confirmed == 50
        assert node_of(made[-1]).port == cluster.node("c1").stream_port  # type: ignore[union-attr]
        assert len(made) == 2 and all(c.closed.done() for c in made), made
    finally:
        cluster.delete(f"{name}-0")
