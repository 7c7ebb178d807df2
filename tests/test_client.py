"""The client's connection set-up: every failure is one named exception, within the timeout, with nothing left open."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from spark_amqp.client import AmqpClient
from spark_amqp.errors import AmqpOptionError, ConnectionLost, HandshakeFailed, is_transient
from spark_amqp.queues.options import parse_source_options
from tests.fake_servers import SilentServer, self_signed


def _options(uri: str, **extra: str):  # type: ignore[no-untyped-def]
    return parse_source_options({"uri": uri, "queue": "q", **extra}).connection


def test_a_silent_broker_times_out_and_the_socket_is_closed() -> None:
    server = SilentServer()
    try:
        began = time.monotonic()
        with pytest.raises(ConnectionLost, match=r"no answer from 127.0.0.1:\d+ within connectionTimeout=0.5s") as info:
            asyncio.run(AmqpClient.connect(_options(f"amqp://u@127.0.0.1:{server.port}/", connectionTimeout="0.5"), "test"))
        assert time.monotonic() - began < 5 and is_transient(info.value)
        assert server.closed_by_client.wait(5), "the timed-out connection's socket was left open"
    finally:
        server.close()


def test_connection_refused_is_transient() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(ConnectionLost, match="cannot connect") as info:
        asyncio.run(AmqpClient.connect(_options(f"amqp://u@127.0.0.1:{port}/", connectionTimeout="5"), "test"))
    assert is_transient(info.value)


@pytest.fixture(scope="module")
def not_this_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "not-this-host")


def test_an_untrusted_certificate_is_a_permanent_handshake_failure(not_this_host: tuple[Path, Path]) -> None:
    cert, key = not_this_host
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = SilentServer(tls)
    try:
        began = time.monotonic()
        with pytest.raises(HandshakeFailed, match=r"TLS: the certificate of 127.0.0.1:\d+ failed verification") as info:
            asyncio.run(AmqpClient.connect(_options(f"amqps://u@127.0.0.1:{server.port}/", connectionTimeout="30"), "test"))
        assert time.monotonic() - began < 10 and not is_transient(info.value)
    finally:
        server.close()


def test_a_ca_file_that_is_not_a_certificate_names_the_option(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("this is not PEM")
    with pytest.raises(AmqpOptionError, match=r"option 'tls.caFile' \(.*ca.pem\): cannot load CA certificates"):
        asyncio.run(AmqpClient.connect(_options("amqps://u@127.0.0.1:1/", **{"tls.caFile": str(bogus)}), "test"))


def _silent_after_handshake(heartbeat: int) -> tuple[socket.socket, threading.Event]:
    """A fake broker: logs the client in with ``heartbeat``, then never sends another byte."""
    from pamqp import commands, frame

    server = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(8)  # protocol header

        def send(method: object) -> None:
            conn.sendall(frame.marshal(method, 0))  # type: ignore[arg-type]

        def read_methods(count: int) -> None:
            buf = b""
            while count:
                buf += conn.recv(65536)
                while True:
                    try:
                        used, _, _ = frame.unmarshal(buf)
                    except Exception:  # incomplete frame: read more
                        break
                    buf, count = buf[used:], count - 1

        send(commands.Connection.Start(server_properties={}, mechanisms="PLAIN", locales="en_US"))
        read_methods(1)
        send(commands.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=heartbeat))
        read_methods(2)  # tune-ok, open
        send(commands.Connection.OpenOk())
        conn.settimeout(30)
        try:
            while conn.recv(1024):  # the client's heartbeats, until it gives up
                pass
        except OSError:
            pass
        closed.set()

    threading.Thread(target=serve, daemon=True).start()
    return server, closed


def test_a_broker_that_stops_sending_heartbeats_is_dropped_as_transient() -> None:
    server, closed = _silent_after_handshake(heartbeat=1)
    port = server.getsockname()[1]

    async def run() -> BaseException:
        client = await AmqpClient.connect(_options(f"amqp://u@127.0.0.1:{port}/", heartbeat="1"), "test")
        return await asyncio.wait_for(client.closed, 10)

    try:
        reason = asyncio.run(run())
        assert isinstance(reason, ConnectionLost) and "missed heartbeats" in str(reason) and is_transient(reason)
        assert closed.wait(5)
    finally:
        server.close()


@pytest.mark.parametrize("protocol", ["amqp0-9-1", "amqp1.0"])
def test_an_unanswered_question_names_an_amqp_0_9_1_method_to_amqp_0_9_1_users_only(protocol: str) -> None:
    # A query over AMQP 1.0 asks some questions over AMQP 0-9-1 as well (stream mode's planning): its outage error once
    # named Channel.Close, a method of a protocol its user never chose.
    server, _ = _silent_after_handshake(heartbeat=0)
    port = server.getsockname()[1]

    async def run() -> str:
        options = _options(f"amqp://u@127.0.0.1:{port}/", protocol=protocol, connectionTimeout="0.5")
        client = await AmqpClient.connect(options, "test")
        with pytest.raises(ConnectionLost) as lost:
            await client.channel()
        return str(lost.value)

    try:
        said = asyncio.run(run())
    finally:
        server.close()
    if protocol == "amqp1.0":
        assert said == "the broker did not answer within 0.5s", said
    else:
        assert said == "the broker did not answer Channel.Open within 0.5s", said
