"""Fault injection and the broker-wide consumer_timeout: embedded broker only."""

from __future__ import annotations

import random
import socket
import threading
import time
import urllib.parse
from typing import Any

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from .helpers import connect, drain, wait_for


def _queue(broker: EmbeddedBroker, name: str = "q", **kwargs) -> pika.BlockingConnection:  # type: ignore[no-untyped-def]
    conn = connect(broker.url)
    conn.channel().queue_declare(name, **kwargs)
    return conn


def test_nack_next_publishes(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded)
    ch = conn.channel()
    ch.confirm_delivery()
    embedded.nack_next_publishes(2)
    for _ in range(2):
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "q", b"refused")
    ch.basic_publish("", "q", b"accepted")
    assert [b for _, _, b in drain(ch, "q")] == [b"accepted"]


def test_hold_confirms_until_released(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded)
    ch = conn.channel()
    ch.confirm_delivery()
    embedded.hold_confirms()
    done = threading.Event()
    # BlockingChannel waits for the confirm; release it from another thread.
    threading.Timer(0.5, lambda: (done.set(), embedded.release_confirms())).start()
    start = time.monotonic()
    ch.basic_publish("", "q", b"m")
    assert done.is_set() and time.monotonic() - start >= 0.45


def test_hold_confirms_for_seconds(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded)
    ch = conn.channel()
    ch.confirm_delivery()
    embedded.hold_confirms(0.6)
    start = time.monotonic()
    ch.basic_publish("", "q", b"m")
    assert 0.5 <= time.monotonic() - start < 5
    assert embedded.queue_stats("q")["ready"] == 1  # held confirms do not hold routing


def test_drop_connections_requeues_their_deliveries(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded)
    ch = conn.channel()
    for i in range(3):
        ch.basic_publish("", "q", b"%d" % i)
    drain(ch, "q", ack=False)
    assert embedded.queue_stats("q") == {"ready": 0, "unacked": 3, "consumers": 0}
    assert embedded.drop_connections() == 1
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        conn.process_data_events(time_limit=1)
        ch.basic_get("q")
    assert wait_for(lambda: embedded.queue_stats("q")["ready"] == 3)
    redelivered = drain(connect(embedded.url).channel(), "q")
    assert all(m.redelivered for m, _, _ in redelivered)


def test_drop_one_connection_leaves_others(embedded: EmbeddedBroker) -> None:
    a = _queue(embedded)
    b = connect(embedded.url)
    assert embedded.drop_connections(1) == 1
    survivors = [c for c in (a, b) if _alive(c)]
    assert len(survivors) == 1


def _alive(conn: pika.BlockingConnection) -> bool:
    try:
        conn.channel().queue_declare("q", passive=True)
        return True
    except pika.exceptions.AMQPError:
        return False


def test_close_channels_with_code(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded)
    ch = conn.channel()
    ch.basic_publish("", "q", b"m")
    closed: list[tuple[int, str]] = []
    ch._impl.add_on_close_callback(lambda c, reason: closed.append((reason.reply_code, reason.reply_text)))
    ch.basic_consume("q", lambda *a: None)
    conn.process_data_events(time_limit=0.2)
    assert embedded.queue_stats("q")["unacked"] == 1
    assert embedded.close_channels(406, "PRECONDITION_FAILED - injected", queue="q") == 1
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or closed)
    assert closed[0][0] == 406 and "injected" in closed[0][1]
    assert embedded.queue_stats("q") == {"ready": 1, "unacked": 0, "consumers": 0}
    assert conn.is_open  # a channel error, not a connection error


def test_redeliver_unacked_sends_them_again_on_the_same_channel(embedded: EmbeddedBroker) -> None:
    conn = _queue(embedded, durable=True, arguments={"x-queue-type": "quorum"})
    ch = conn.channel()
    for i in range(3):
        ch.basic_publish("", "q", b"%d" % i)
    got: list[tuple[Any, Any, bytes]] = []
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("q", lambda c, m, p, b: got.append((m, p, b)))
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got) == 3)
    ch.basic_ack(1)
    assert embedded.redeliver_unacked("q") == 2
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got) == 5)
    assert [(m.delivery_tag, m.redelivered, b) for m, _, b in got[3:]] == [(4, True, b"1"), (5, True, b"2")]
    assert [p.headers for _, p, _ in got[3:]] == [{"x-acquired-count": 1}] * 2  # a return the delivery-limit does not count
    ch.basic_ack(3)  # an old tag: accepted, and nothing happens
    ch.basic_ack(5, multiple=True)
    conn.process_data_events(time_limit=0.1)
    assert embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1} and ch.is_open


def test_refuse_connections_for_a_while(embedded: EmbeddedBroker) -> None:
    embedded.refuse_connections(1.0)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(embedded.url, connection_attempts=1, socket_timeout=2)
    time.sleep(1.1)
    connect(embedded.url).close()


def test_consumer_timeout_spares_prompt_ackers() -> None:
    with EmbeddedBroker(consumer_timeout_ms=800) as broker:
        conn = _queue(broker, durable=True, arguments={"x-queue-type": "quorum"})
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        got: list[int] = []

        def on(c, m, p, b) -> None:  # type: ignore[no-untyped-def]
            got.append(m.delivery_tag)
            c.basic_ack(m.delivery_tag)

        ch.basic_consume("q", on)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            ch.basic_publish("", "q", b"m")
            conn.process_data_events(time_limit=0.1)
        assert ch.is_open and len(got) > 10


def test_consumer_timeout_can_be_changed_at_runtime(embedded: EmbeddedBroker) -> None:
    assert embedded.consumer_timeout_ms is None
    embedded.consumer_timeout_ms = 1500
    assert embedded.consumer_timeout_ms == 1500


def test_fuzzing_leaks_no_connections(embedded: EmbeddedBroker) -> None:
    rng = random.Random(7)
    parts = urllib.parse.urlsplit(embedded.url)
    for _ in range(30):
        sock = socket.create_connection((parts.hostname, parts.port))
        sock.sendall(b"AMQP\x00\x00\x09\x01" + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 2000))))
        sock.close()
    assert wait_for(lambda: embedded.connection_count() == 0, timeout=15)


def test_standalone_cli_serves_clients(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_amqp_broker", "--port", str(port), "--user", "u", "--password", "p w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"amqp://u:p%20w@127.0.0.1:{port}/%2F"
        # A loaded machine can take many seconds to start a Python process.
        conn = wait_for(lambda: _try_connect(url), timeout=120, interval=0.2)
        assert conn.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
        conn.close()
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
    assert code == 0, proc.stdout.read().decode() if proc.stdout else code


def _try_connect(url: str) -> pika.BlockingConnection | None:
    try:
        return connect(url, connection_attempts=1)
    except pika.exceptions.AMQPConnectionError:
        return None


def test_drop_connections_by_client_name(embedded: EmbeddedBroker) -> None:
    _queue(embedded).close()
    mine = connect(embedded.url, client_properties={"connection_name": "victim"})
    other = connect(embedded.url)
    assert embedded.drop_connections(name_contains="victim") == 1
    assert _alive(other) and not _alive(mine)


def test_ended_connections_tell_clean_closes_from_losses(embedded: EmbeddedBroker) -> None:
    connect(embedded.url, client_properties={"connection_name": "polite"}).close()
    connect(embedded.url, client_properties={"connection_name": "cut"})
    embedded.drop_connections(name_contains="cut")
    assert wait_for(lambda: len(embedded.ended_connections()) == 2)
    assert sorted(embedded.ended_connections()) == [("cut", "lost"), ("polite", "closed by client")]
