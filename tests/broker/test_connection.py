"""Protocol header, authentication, tuning, heartbeats, channels."""

from __future__ import annotations

import socket
import time
import urllib.parse

import pika
import pytest
from pamqp import commands

from ..rawclient import PROTOCOL_HEADER, RawClient
from .helpers import connect, wait_for


def _with_password(url: str, password: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


AMQP_1_0_SASL = b"AMQP\x03\x01\x00\x00"


@pytest.mark.parametrize("header", [b"HTTP/1.1\r\n", b"AMQP\x00\x00\x09\x02", b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x00\x08\x00"])
def test_wrong_protocol_header_gets_a_header_back_and_close(amqp_url: str, broker_version: tuple[int, int], header: bytes) -> None:
    client = RawClient(amqp_url)
    client.send_raw(header)
    # 3.10 offers AMQP 0-9-1 to anything; 4.x also serves AMQP 1.0 on this port and offers
    # that (its SASL header), except to a client that asked for another AMQP 0-9 revision.
    expected = PROTOCOL_HEADER if broker_version < (4, 0) or header.startswith(b"AMQP\x00\x00\x09") else AMQP_1_0_SASL
    assert client.recv_raw(timeout=5) == expected


def test_bad_credentials_get_403(amqp_url: str) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(_with_password(amqp_url, "wrong-password"))
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)


def test_bad_credentials_without_capability_just_close(amqp_url: str) -> None:
    client = RawClient(_with_password(amqp_url, "nope"))
    with pytest.raises(EOFError):
        client.handshake()


def test_tune_offers_rabbitmq_limits(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    tune = client.handshake()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    _, ok = client.read_method()
    assert isinstance(ok, commands.Connection.OpenOk)
    client.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    _, close_ok = client.read_method()
    assert isinstance(close_ok, commands.Connection.CloseOk)


def test_channel_max_zero_is_refused(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.send_raw(PROTOCOL_HEADER)
    client.read_method()
    client.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    client.read_method()
    client.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
    client.send(0, commands.Connection.Open())
    with pytest.raises(EOFError):
        client.read_method(timeout=10)


def test_unknown_vhost_is_530(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake(vhost="no-such-vhost")
    _, close = client.read_method()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 530 and "no-such-vhost" in close.reply_text


def test_small_frame_max_splits_bodies(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url, frame_max=8192)
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    body = bytes(range(256)) * 4096  # 1 MiB, 129 frames of at most 8184 bytes
    ch.basic_publish("", q, body)
    method, _, got = ch.basic_get(q, auto_ack=True)
    assert method is not None and got == body
    conn.close()


def test_frame_max_below_minimum_is_refused(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    with pytest.raises(EOFError):
        client.handshake(frame_max=1000)
        client.read_method(timeout=10)


def test_frame_max_4096_is_too_small_from_4_3(amqp_url: str, broker_version: tuple[int, int]) -> None:
    # AMQP's own minimum is 4096, which 3.10 and 4.0 take; 4.3 resets a connection below 8192.
    client = RawClient(amqp_url)
    if broker_version >= (4, 3):
        with pytest.raises((EOFError, ConnectionResetError)):
            client.handshake(frame_max=4096)
            client.read_method(timeout=10)
    else:
        client.handshake(frame_max=4096)
        _, ok = client.read_method(timeout=10)
        assert isinstance(ok, commands.Connection.OpenOk)


def test_heartbeats_are_sent_and_dead_peer_is_dropped(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake(heartbeat_s=1)
    client.read_method()  # open-ok
    start = time.monotonic()
    beats = 0
    with pytest.raises((EOFError, ConnectionResetError)):
        while time.monotonic() - start < 10:
            _channel, _frame = client.read_frame(timeout=10)
            beats += 1
    elapsed = time.monotonic() - start
    # Silent client: the broker keeps beating, then gives up after ~2 missed intervals.
    assert beats >= 2
    assert 1.5 <= elapsed <= 6


def test_heartbeat_keeps_a_live_client_connected(amqp_url: str) -> None:
    conn = connect(amqp_url, heartbeat=1)
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    assert conn.is_open
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


def test_many_channels_are_independent(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    q = names.queue()
    channels = [conn.channel() for _ in range(200)]
    channels[0].queue_declare(q)
    for i, ch in enumerate(channels):
        ch.basic_publish("", q, str(i).encode())
    # An error on one channel closes only that channel.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channels[5].queue_declare("test.missing.queue", passive=True)
    assert info.value.reply_code == 404
    # Publishes on different channels are routed independently (RabbitMQ: one process each).
    assert wait_for(lambda: channels[6].queue_declare(q, passive=True).method.message_count == 200)
    conn.close()


def test_channel_open_twice_and_unopened_channel_are_504(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.send(1, commands.Channel.Open())
    _, close = client.read_method()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 504
    client = RawClient(amqp_url)
    client.handshake()
    client.read_method()
    client.send(7, commands.Queue.Declare(queue="x"))
    _, close = client.read_method()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 504


def _closed_connection(client: RawClient) -> tuple[int, str, int, int]:
    _, close = client.read_method(timeout=10)
    assert isinstance(close, commands.Connection.Close), close
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def _channel_max_reached(opened: int) -> tuple[int, str, int, int]:
    return 530, f"NOT_ALLOWED - number of channels opened ({opened}) has reached the negotiated channel_max ({opened})", 0, 0


def test_channel_max_limits_how_many_channels_are_open_not_their_numbers(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake(channel_max=3)
    client.read_method()
    for number in (1, 2048, 65535):  # numbers above channel_max are fine (3.10, 4.0 and 4.3 alike)
        client.open_channel(number)
    client.send(2048, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    _, close_ok = client.read_method()
    assert isinstance(close_ok, commands.Channel.CloseOk)
    client.open_channel(4)  # a closed channel frees its place
    # A channel the broker closed keeps its place until the client's close-ok.
    client.send(4, commands.Queue.Declare(queue="test.missing.queue", passive=True))
    _, close = client.read_method()
    assert isinstance(close, commands.Channel.Close) and close.reply_code == 404
    client.send(5, commands.Channel.Open())
    assert _closed_connection(client) == _channel_max_reached(3)


def test_any_frame_on_a_new_channel_counts_against_channel_max(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake(channel_max=2)
    client.read_method()
    client.open_channel(1)
    client.open_channel(2)
    client.send(2, commands.Queue.Declare(queue="test.missing.queue", passive=True))
    client.read_method()
    client.send(2, commands.Channel.CloseOk())
    client.open_channel(3)  # close-ok given: the place is free again
    client.send(4, commands.Queue.Declare(queue="", exclusive=True))  # not channel.open (that alone would be 504)
    assert _closed_connection(client) == _channel_max_reached(2)


def test_connection_close_by_client_is_acknowledged(amqp_url: str) -> None:
    conn = connect(amqp_url)
    conn.channel()
    conn.close()
    assert conn.is_closed


def test_server_properties_advertise_confirms_and_cancel_notify(amqp_url: str) -> None:
    conn = connect(amqp_url)
    caps = conn._impl.server_capabilities
    assert caps.get("publisher_confirms") and caps.get("consumer_cancel_notify") and caps.get("basic.nack")
    conn.close()


def test_half_open_socket_does_not_block_other_clients(amqp_url: str) -> None:
    parts = urllib.parse.urlsplit(amqp_url)
    idle = socket.create_connection((parts.hostname, parts.port))
    idle.sendall(b"AMQ")  # partial header, then nothing
    conn = connect(amqp_url)
    assert conn.channel().is_open
    conn.close()
    idle.close()
