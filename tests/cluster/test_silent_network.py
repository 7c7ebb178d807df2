"""A silent network under each of the connector's clients: a node of the real cluster whose client ports drop every
packet (``tools/netfault``: iptables DROP, no reset), so an open connection hears nothing and a new one gets no
answer. Each client must notice by its heartbeats, within about twice the heartbeat, and a connection attempt must
end at ``connectionTimeout``: no read or write may wait on a dead socket. No Spark here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.client import AmqpClient
from spark_amqp.errors import AmqpProtocolError, is_transient
from spark_amqp.option_reader import OptionReader
from spark_amqp.stream_protocol.client import StreamClient
from spark_amqp.transport.options import CONNECTION_KEYS, ConnectionOptions, parse_connection

from .conftest import Cluster, silent_network_possible

# The fault lane's (make test): no other lane touches the cluster.
pytestmark = pytest.mark.cluster

HEARTBEAT = 3  # seconds
# How long a silence ends a connection: two heartbeats (AMQP 0-9-1, the stream protocol); over AMQP 1.0 the option is
# the idle-time-out the client announces, and a silence of it is the end.
SILENCE = {"AMQP 0-9-1": 2 * HEARTBEAT, "AMQP 1.0": HEARTBEAT, "stream protocol": 2 * HEARTBEAT}


@pytest.fixture(autouse=True)
def _can_drop_packets() -> None:
    why = silent_network_possible()
    if why:
        pytest.skip(why)


def _options(host: str, port: int, scheme: str, **extra: str) -> ConnectionOptions:
    given = {"uri": f"{scheme}://guest:guest@{host}:{port}/%2F", "heartbeat": str(HEARTBEAT), "connectionTimeout": "4", **extra}
    return parse_connection(OptionReader(given, {k.lower(): k for k in CONNECTION_KEYS}), stream_protocol=scheme != "amqp")


CLIENTS: dict[str, Callable[[Cluster], Awaitable[Any]]] = {
    "AMQP 0-9-1": lambda c: AmqpClient.connect(_options("127.0.0.1", c.node("c1").port, "amqp"), "silent network test"),
    "AMQP 1.0": lambda c: Amqp10Client.connect(_options("127.0.0.1", c.node("c1").port, "amqp", protocol="amqp1.0"), "silent network test"),
    "stream protocol": lambda c: StreamClient.connect(
        _options("127.0.0.1", c.node("c1").stream_port, "rabbitmq-stream"), "silent network test"
    ),
}


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_an_open_connection_to_a_silent_node_ends_within_two_heartbeats(cluster: Cluster, protocol: str) -> None:
    async def run() -> tuple[float, BaseException]:
        client = await CLIENTS[protocol](cluster)
        try:
            with cluster.silenced("c1"):
                began = time.monotonic()
                reason = await asyncio.wait_for(asyncio.shield(client.closed), timeout=60)
                return time.monotonic() - began, reason
        finally:
            await client.close()

    took, reason = asyncio.run(run())
    # The last frame came up to half a heartbeat before the drop, and the check runs every quarter of the silence.
    assert SILENCE[protocol] - HEARTBEAT / 2 - 0.5 <= took <= 4 * HEARTBEAT, took
    assert "missed heartbeats" in str(reason) and is_transient(reason), reason


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_connecting_to_a_silent_node_ends_at_connection_timeout(cluster: Cluster, protocol: str) -> None:
    async def run() -> float:
        began = time.monotonic()
        with pytest.raises(AmqpProtocolError, match=r"no answer from 127.0.0.1:\d+ within connectionTimeout=4s") as caught:
            await CLIENTS[protocol](cluster)
        assert is_transient(caught.value), caught.value
        return time.monotonic() - began

    with cluster.silenced("c1"):
        took = asyncio.run(run())
    assert 3.5 <= took <= 20, took
