"""A real RabbitMQ cluster named by one uri (``AMQP_TEST_CLUSTER_URL``, ``AMQP_TEST_CLUSTER_STREAM_URL``: see
``tests/brokers.py``), and its nodes, which a test may stop or drain for a short while: ``tools/rabbitmq``
runs them (``c1``, ``c2``, ``c3``). Whatever a test stops or drains is started or revived again however
the test ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from tests.brokers import CLUSTER_STREAM_URL, CLUSTER_URL, TOOLS
from tests.locks import exclusive


@dataclass(frozen=True)
class Node:
    name: str  # as tools/rabbitmq calls it: c1, c2, c3
    port: int  # AMQP 0-9-1
    stream_port: int


def port_of(url: str) -> int:
    return int(url.rpartition("@")[2].partition("/")[0].rpartition(":")[2])


def hosts_of(url: str) -> list[str]:
    return url.rpartition("@")[2].partition("/")[0].split(",")


def with_hosts(url: str, hosts: list[str]) -> str:
    """``url`` naming ``hosts`` instead of its own."""
    head, at, address = url.rpartition("@")
    return f"{head}{at}{','.join(hosts)}/{address.partition('/')[2]}"


class ToolFailed(subprocess.CalledProcessError):
    """CalledProcessError that says what the tool printed: its own message leaves that out."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stdout}{self.stderr}"


def _tool(*args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(TOOLS), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise ToolFailed(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout.strip()


NETFAULT = TOOLS.parent / "netfault"


def _netfault(*args: str) -> None:
    subprocess.run([str(NETFAULT), *args], check=True, capture_output=True, text=True, timeout=60)


def silent_network_possible() -> str | None:
    """Why packets cannot be dropped here (``tools/netfault install`` installs iptables), or None."""
    if os.geteuid() != 0:
        return "dropping packets needs root (iptables)"
    if shutil.which("iptables") is None:
        return "iptables is not installed: tools/netfault install"
    return None


def _cgroup2_root() -> str:
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[2] == "cgroup2":
                return fields[1]
    raise AssertionError("this machine has no cgroup2 hierarchy, which tools/netfault isolate needs")


@dataclass(frozen=True)
class Cluster:
    url: str
    stream_url: str | None
    nodes: tuple[Node, ...]  # those tools/rabbitmq runs, found by their ports in url

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        pytest.skip(f"node {name} of the cluster is not one tools/rabbitmq runs")

    def stream_port(self, uri: str | None = None) -> dict[str, str]:
        """Option ``streamPort`` for a stream read over ``uri`` (AMQP 0-9-1 or 1.0; the cluster's by default): the stream
        protocol's port of the node its first host names, where the read asks what RabbitMQ did not deliver. Here the
        nodes share one host, each with ports of its own, and the default 5552 is another broker's."""
        first = urllib.parse.urlsplit((uri or self.url).split(",")[0]).port
        return next(({"streamPort": str(n.stream_port)} for n in self.nodes if n.port == first), {})

    def delete(self, *queues: str) -> None:
        """Delete ``queues`` through the first node that answers (a test may have stopped one)."""
        for node in self.nodes:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"))
            except pika.exceptions.AMQPError:
                continue
            for queue in queues:
                conn.channel().queue_delete(queue)
            conn.close()
            return

    @contextmanager
    def stopped(self, name: str) -> Iterator[float]:
        """Node ``name`` stopped (its ports refuse) for the block; yields how long stopping took."""
        self.node(name)
        began = time.monotonic()
        try:
            _tool("stop", name)
            yield time.monotonic() - began
        finally:
            _tool("start", name)  # waits until the cluster reports it running

    @contextmanager
    def stopping(self, name: str, delay: float) -> Iterator[threading.Thread]:
        """Node ``name`` stopped ``delay`` seconds into the block, while the block runs (the block sees the
        failover as it happens); started again after it. Yields the thread that stops it."""
        self.node(name)
        stopper = threading.Timer(delay, _tool, ("stop", name))
        stopper.start()
        try:
            yield stopper
        finally:
            stopper.cancel()
            stopper.join()
            _tool("start", name)

    @contextmanager
    def silenced(self, name: str) -> Iterator[None]:
        """Node ``name``'s client ports (AMQP and stream) silent for the block: their packets dropped both ways
        (``tools/netfault``), so connections stay open and hear nothing. The cluster's own traffic goes on."""
        node = self.node(name)
        try:
            _netfault("drop", str(node.port), str(node.stream_port))
            yield
        finally:
            _netfault("clear")

    @contextmanager
    def partitioned(self, name: str) -> Iterator[None]:
        """Node ``name`` cut off from the other nodes for the block, not from its clients: every packet its processes
        send is dropped but for replies from its AMQP and stream ports (``tools/netfault isolate``), so Erlang
        distribution and stream replication break both ways while its clients are served as before."""
        node = self.node(name)
        group = _tool("cgroup", name)
        procs = Path(f"{_cgroup2_root()}/{group}/cgroup.procs")
        assert procs.read_text().strip(), f"{name} runs outside its cgroup {group}: restart it with tools/rabbitmq"
        try:
            _netfault("isolate", group, str(node.port), str(node.stream_port))
            yield
        finally:
            _netfault("clear")

    @contextmanager
    def drained(self, name: str) -> Iterator[None]:
        """Node ``name`` in maintenance mode for the block: it closes its clients (320) and takes no new ones."""
        self.node(name)
        try:
            _tool("cli", name, "rabbitmq-upgrade", "drain")
            yield
        finally:
            _tool("cli", name, "rabbitmq-upgrade", "revive")


@contextmanager
def cluster_lock() -> Iterator[None]:
    """One cluster test at a time across pytest-xdist's workers and test runs: a test that stops a node would
    break another that counts on every node (or stops the same one)."""
    with exclusive("cluster"):
        yield


@pytest.fixture(autouse=True)
def one_at_a_time() -> Iterator[None]:
    with cluster_lock():
        yield


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return find_cluster()


def find_cluster() -> Cluster:
    """The cluster of ``AMQP_TEST_CLUSTER_URL`` and those of its nodes ``tools/rabbitmq`` runs (skips without one)."""
    if CLUSTER_URL is None:
        pytest.skip("AMQP_TEST_CLUSTER_URL not set: no RabbitMQ cluster (tools/rabbitmq cluster-url)")
    ports = {int(h.rpartition(":")[2]) for h in hosts_of(CLUSTER_URL)}
    nodes = []
    for name in ("c1", "c2", "c3"):
        try:
            node = Node(name, port_of(_tool("url", name, timeout=10)), port_of(_tool("stream-url", name, timeout=10)))
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if node.port in ports:
            nodes.append(node)
    return Cluster(CLUSTER_URL, CLUSTER_STREAM_URL, tuple(nodes))


@pytest.fixture
def stream_url(cluster: Cluster) -> str:
    if cluster.stream_url is None:
        pytest.skip("AMQP_TEST_CLUSTER_STREAM_URL not set (tools/rabbitmq cluster-stream-url)")
    return cluster.stream_url
