"""AMQP 1.0's handshake on the AMQP port, on the embedded broker and RabbitMQ 4.3 alike: the protocol header chooses
the protocol, SASL comes first, ``open`` says RabbitMQ and its version, and an idle client is sent empty frames."""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from typing import Any

import pytest

from spark_amqp.amqp10 import performatives as p
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Described, Symbol, UInt, encode

from .amqp10_helpers import embedded, run, url

__all__ = ["url"]


def _socket(address: str) -> socket.socket:
    parts = urllib.parse.urlsplit(address)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=5)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _frame(sock: socket.socket) -> p.Frame:
    head = _read_exactly(sock, 4)
    (size,) = struct.unpack(">I", head)
    data = head + _read_exactly(sock, size - 4)
    return p.read_frame(data, 0, size)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def _login(sock: socket.socket, address: str, password: str | None = None) -> p.Frame:
    parts = urllib.parse.urlsplit(address)
    sock.sendall(p.SASL_HEADER)
    assert _read_exactly(sock, 8) == p.SASL_HEADER
    _frame(sock)  # the mechanisms
    secret = password if password is not None else urllib.parse.unquote(parts.password or "")
    sock.sendall(p.sasl_init("PLAIN", b"\x00" + (parts.username or "").encode() + b"\x00" + secret.encode(), None))
    return _frame(sock)


def test_a_bare_amqp_1_0_header_is_answered_with_sasls_and_the_socket_closes(url: str) -> None:
    with _socket(url) as sock:
        sock.sendall(p.AMQP_HEADER)
        assert _read_exactly(sock, 8) == p.SASL_HEADER  # a login comes first
        assert _closed(sock)


def test_sasl_offers_plain_amqplain_and_anonymous_as_an_array(url: str) -> None:
    with _socket(url) as sock:
        sock.sendall(p.SASL_HEADER)
        assert _read_exactly(sock, 8) == p.SASL_HEADER
        head = _read_exactly(sock, 4)
        body = _read_exactly(sock, struct.unpack(">I", head)[0] - 4)
        frame = p.read_frame(head + body, 0, len(head) + len(body))
    assert frame.kind == 1 and frame.code == P.SASL_MECHANISMS
    assert [str(m) for m in frame.fields[0]] == ["PLAIN", "AMQPLAIN", "ANONYMOUS"]
    assert b"\xe0" in body  # an array of symbols (python-qpid-proton takes no list there)


def test_a_wrong_password_is_sasl_outcome_auth_then_the_end(url: str) -> None:
    with _socket(url) as sock:
        outcome = _login(sock, url, password="wrong")
        assert (outcome.kind, outcome.code, outcome.fields[0]) == (1, P.SASL_OUTCOME, 1)
        assert _closed(sock)


def test_open_says_rabbitmq_its_version_and_its_largest_frame(url: str) -> None:
    def opened(client: Any) -> Any:
        async def answer() -> Any:
            return client.server_properties, client.server_version, client.max_frame

        return answer()

    properties, version, max_frame = run(url, opened)
    assert properties[Symbol("product")] == "RabbitMQ" and version >= (4, 3)
    if embedded(url):
        assert max_frame == 131072  # RabbitMQ's frame_max


def test_an_idle_client_is_sent_empty_frames_within_half_its_idle_time_out(url: str) -> None:
    with _socket(url) as sock:
        assert _login(sock, url).fields[0] == 0
        sock.sendall(p.AMQP_HEADER)
        assert _read_exactly(sock, 8) == p.AMQP_HEADER
        sock.sendall(p.open_("idle-test", None, 65536, 1000, {}))  # idle-time-out 1 s
        opened = _frame(sock)
        assert opened.code == P.OPEN and opened.fields[2] >= 512
        started = time.monotonic()
        frame = _frame(sock)
        assert frame.code is None, frame  # an empty frame
        assert time.monotonic() - started < 1.0


def test_a_frame_on_a_channel_without_a_session_ends_the_connection_with_an_error(url: str) -> None:
    with _socket(url) as sock:
        assert _login(sock, url).fields[0] == 0
        sock.sendall(p.AMQP_HEADER)
        assert _read_exactly(sock, 8) == p.AMQP_HEADER
        sock.sendall(p.open_("bad-test", None, 65536, 0, {}))
        assert _frame(sock).code == P.OPEN
        flow = encode(Described(P.FLOW, [UInt(0), UInt(10), UInt(0), UInt(10)]))
        sock.sendall(p.frame(7, flow))
        frame = _frame(sock)
        while frame.code is None:
            frame = _frame(sock)
        assert frame.code in (P.CLOSE, P.END)
        error = p.error_of(frame.fields, 0)
        assert error is not None and error[0].startswith("amqp:")


@pytest.mark.parametrize("mechanism", ["ANONYMOUS"])
def test_an_anonymous_login_is_guest(url: str, mechanism: str) -> None:
    bare = url.partition("://")[0] + "://" + url.rpartition("@")[2]

    def nothing(client: Any) -> Any:
        async def done() -> None:
            return None

        return done()

    run(bare, nothing, authMechanism=mechanism)
