"""A uri naming several nodes, on live brokers: a dead or silent node costs no more than its own refusal or
``connectionTimeout``, the walk goes on at once to the next, and a refusal that would be the same on every node
ends it (the embedded broker and every real node; both clients)."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from spark_amqp.client import AmqpClient
from spark_amqp.errors import AccessRefused, AllEndpointsFailed, ConnectionLost, HandshakeFailed, StreamResponseError, is_transient
from spark_amqp.option_reader import OptionReader
from spark_amqp.stream_protocol.client import StreamClient
from spark_amqp.transport import endpoints
from spark_amqp.transport.endpoints import EndpointOrder
from spark_amqp.transport.options import ConnectionOptions, parse_connection
from tests import brokers
from tests.fake_servers import Listener, SilentServer, self_signed

KNOWN = {k.lower(): k for k in ("uri", "password", "connectionTimeout", "tls.caFile")}
DEAD = "127.0.0.1:1"  # nothing listens on port 1: refused at once


@pytest.fixture
def stream_url(amqp_url: str) -> str:
    """The stream-protocol url of the test's broker (the embedded one serves it too)."""
    url = brokers.STREAM_URLS.get(amqp_url)
    if url is None:
        pytest.skip("no stream-protocol url for this broker (AMQP_TEST_STREAM_BROKERS)")
    return url


def with_endpoints(url: str, before: list[str], after: list[str] | None = None) -> str:
    """``url`` with more endpoints before (and after) its own host."""
    scheme, _, rest = url.partition("://")
    userinfo, at, address = rest.rpartition("@")
    host, slash, path = address.partition("/")
    hosts = ",".join([*before, host, *(after or [])])
    return f"{scheme}://{userinfo}{at}{hosts}{slash}{path}"


def options(url: str, stream: bool = False, **extra: str) -> ConnectionOptions:
    return parse_connection(OptionReader({"uri": url, "connectionTimeout": "10", **extra}, KNOWN), stream_protocol=stream)


def timed_connect(opts: ConnectionOptions, client: Any = AmqpClient) -> float:
    """Seconds until ``client`` is connected (it is closed again)."""

    async def main() -> float:
        began = time.monotonic()
        connection = await client.connect(opts, "spark-amqp test dial")
        took = time.monotonic() - began
        await connection.close()
        return took

    return float(asyncio.run(main()))


class ClosingServer(Listener):
    """A node that is shutting down: answers the protocol header with ``connection.close`` 320, as RabbitMQ
    does to clients that come while it stops or is drained."""

    def __init__(self) -> None:
        from pamqp import commands, frame

        reason = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        close = commands.Connection.Close(reply_code=320, reply_text=reason, class_id=0, method_id=0)
        self.frame = frame.marshal(close, 0)
        self.served = 0
        super().__init__()

    def accepted(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(8)
            conn.sendall(self.frame)
            self.served += 1
            conn.settimeout(5)
            try:
                conn.recv(1024)  # close-ok
            except OSError:
                pass


# -- AMQP 0-9-1 ---------------------------------------------------------------------------------------


def test_a_dead_node_first_costs_nothing(amqp_url: str, listed: None) -> None:
    took = timed_connect(options(with_endpoints(amqp_url, [DEAD, "127.0.0.1:2"])))
    assert took < 1.0, f"{took:.2f}s to reach the live node behind two refusing ones"


def test_shuffled_rounds_always_reach_the_live_node(amqp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "ORDER", EndpointOrder(random.Random(11)))
    opts = options(with_endpoints(amqp_url, [DEAD], ["127.0.0.1:2"]))
    took = [timed_connect(opts) for _ in range(8)]
    assert max(took) < 1.0, took


def test_a_silent_node_costs_its_connection_timeout_then_the_next_answers(amqp_url: str, listed: None) -> None:
    silent = SilentServer()
    try:
        took = timed_connect(options(with_endpoints(amqp_url, [f"127.0.0.1:{silent.port}"]), connectionTimeout="0.5"))
        assert 0.5 <= took < 2.0, took
    finally:
        silent.close()


def test_a_node_that_is_shutting_down_sends_the_client_on(amqp_url: str, listed: None) -> None:
    closing = ClosingServer()
    try:
        took = timed_connect(options(with_endpoints(amqp_url, [f"127.0.0.1:{closing.port}"])))
        assert took < 1.0 and closing.served == 1
    finally:
        closing.close()


def test_a_refused_login_is_not_tried_on_the_other_nodes(amqp_url: str, listed: None) -> None:
    closing = ClosingServer()
    try:
        uri = with_endpoints(amqp_url, [DEAD], [f"127.0.0.1:{closing.port}"])
        with pytest.raises(AccessRefused) as info:
            timed_connect(options(uri, password="wrong-pw"))
        assert not is_transient(info.value) and closing.served == 0 and "wrong-pw" not in str(info.value)
    finally:
        closing.close()


def test_every_node_failing_names_each_and_why(listed: None) -> None:
    silent, closing = SilentServer(), ClosingServer()
    try:
        uri = f"amqp://guest:s3cret-pw@{DEAD},127.0.0.1:{silent.port},127.0.0.1:{closing.port}/%2F"
        began = time.monotonic()
        with pytest.raises(AllEndpointsFailed) as info:
            timed_connect(options(uri, connectionTimeout="0.5"))
        assert time.monotonic() - began < 3.0
        message = str(info.value)
        assert message.startswith(
            f"cannot connect to any of 127.0.0.1:1 (connection refused), 127.0.0.1:{silent.port} (no answer within "
            f"connectionTimeout=0.5s), 127.0.0.1:{closing.port} (320 CONNECTION_FORCED - broker forced connection closure"
        ), message
        assert is_transient(info.value) and "s3cret-pw" not in message
    finally:
        silent.close()
        closing.close()


def test_a_name_with_several_addresses_tries_each(amqp_url: str, listed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DNS name for the whole cluster (one A record per node): its addresses are walked as the endpoints are."""
    live = amqp_url.rpartition("@")[2].partition("/")[0]
    ip, _, live_port = live.rpartition(":")
    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: asyncio.BaseEventLoop, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rabbit.test":
            return await real(self, host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port))) for a in ("127.0.0.2", "127.0.0.3", ip)]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    assert timed_connect(options(amqp_url.replace(live, f"rabbit.test:{live_port}"))) < 1.0
    with pytest.raises(AllEndpointsFailed) as info:
        timed_connect(options(f"amqp://guest:guest@rabbit.test:1,{DEAD}/%2F"))
    assert str(info.value) == (
        "cannot connect to any of rabbit.test:1 at 127.0.0.2 (connection refused), rabbit.test:1 at 127.0.0.3 (connection "
        f"refused), rabbit.test:1 at {ip} (connection refused), 127.0.0.1:1 (connection refused)"
    )


def test_an_ipv6_node_in_brackets(listed: None) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    from spark_amqp_broker import EmbeddedBroker

    with EmbeddedBroker(host="::1") as broker:
        assert timed_connect(options(f"amqp://guest:guest@{DEAD},[::1]:{broker.port}/%2F")) < 1.0
        stream = options(f"rabbitmq-stream://guest:guest@[::1]:{broker.stream_port},{DEAD}/%2F", stream=True)
        assert timed_connect(stream, StreamClient) < 1.0


# -- the stream protocol -------------------------------------------------------------------------------


def test_stream_protocol_a_dead_node_first_costs_nothing(stream_url: str, listed: None) -> None:
    took = timed_connect(options(with_endpoints(stream_url, [DEAD, "127.0.0.1:2"]), stream=True), StreamClient)
    assert took < 1.0, took


def test_stream_protocol_a_silent_node_costs_its_connection_timeout(stream_url: str, listed: None) -> None:
    silent = SilentServer()
    try:
        opts = options(with_endpoints(stream_url, [f"127.0.0.1:{silent.port}"]), stream=True, connectionTimeout="0.5")
        took = timed_connect(opts, StreamClient)
        assert 0.5 <= took < 2.0, took
    finally:
        silent.close()


def test_stream_protocol_a_refused_login_ends_the_walk(stream_url: str, listed: None) -> None:
    uri = with_endpoints(stream_url, [DEAD], ["127.0.0.1:2"])
    with pytest.raises(StreamResponseError, match="authentication failure") as info:
        timed_connect(options(uri, stream=True, password="wrong-pw"), StreamClient)
    assert not is_transient(info.value)


# -- TLS -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def localhost_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "localhost", alt_name="localhost")


def test_tls_checks_the_certificate_against_the_host_name_not_its_address(localhost_cert: tuple[Path, Path], listed: None) -> None:
    """``localhost`` resolves to 127.0.0.1 (and perhaps ::1): the connection goes to an address, but the server name
    sent and checked is ``localhost``, which the certificate names (an address would fail verification)."""
    cert, key = localhost_cert
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    silent = SilentServer(tls)
    try:
        uri = f"amqps://guest@{DEAD},localhost:{silent.port}/%2F"
        with pytest.raises(ConnectionLost) as info:
            timed_connect(options(uri, connectionTimeout="1", **{"tls.caFile": str(cert)}))
        assert "no answer within connectionTimeout=1s" in str(info.value) and "verification" not in str(info.value)
        assert silent.names and set(silent.names) == {"localhost"}
    finally:
        silent.close()


def test_an_untrusted_certificate_ends_the_walk(localhost_cert: tuple[Path, Path], listed: None) -> None:
    cert, key = localhost_cert
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    silent, other = SilentServer(tls), SilentServer()
    try:
        uri = f"amqps://guest@{DEAD},127.0.0.1:{silent.port},127.0.0.1:{other.port}/%2F"  # no tls.caFile: untrusted
        began = time.monotonic()
        with pytest.raises(HandshakeFailed, match=rf"TLS: the certificate of 127.0.0.1:{silent.port} failed verification"):
            timed_connect(options(uri, connectionTimeout="5"))
        assert time.monotonic() - began < 3.0  # the silent node after it was never tried
    finally:
        silent.close()
        other.close()
