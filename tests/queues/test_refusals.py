"""Permanent refusals fail the source at once with the broker's reply; transient faults are retried.

Every test gives ``connectionTimeout=30``: a refusal that is retried until
that runs out would fail the time check, not just the message check.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.errors import AmqpSourceError
from spark_amqp.queues import session as session_module
from spark_amqp.queues.options import parse_source_options

from ..brokers import publish
from .driver import MicroBatchDriver

FAST = 10.0  # seconds: "at once", on a loaded machine


def _start_fails(url: str, queue: str, available_now: bool = False, **options: Any) -> str:
    d = MicroBatchDriver(url, queue, connectionTimeout=30, **options)
    began = time.monotonic()
    try:
        with pytest.raises(AmqpSourceError) as info:
            if available_now:
                d.runtime.prepare_available_now()
            d.runtime.ensure_started()
            d.plan(wait=1)
    finally:
        d.close()
    elapsed = time.monotonic() - began
    assert elapsed < FAST, f"took {elapsed:.1f}s: {info.value}"
    return str(info.value)


def _with(url: str, user: str | None = None, password: str | None = None, vhost: str | None = None) -> str:
    params = pika.URLParameters(url)
    user = user or params.credentials.username
    password = password or params.credentials.password
    vhost = "%2F" if (vhost or params.virtual_host) == "/" else (vhost or params.virtual_host)
    return f"amqp://{user}:{password}@{params.host}:{params.port}/{vhost}"


@pytest.mark.parametrize("available_now", [False, True], ids=["start", "available-now"])
def test_wrong_password_names_the_login_refusal_under_every_trigger(amqp_url: str, names, available_now: bool) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"x"])
    message = _start_fails(_with(amqp_url, password="wrong-secret-9"), q, available_now)
    assert "refused the login of user 'guest'" in message and "403" in message
    assert "wrong-secret-9" not in message and "cannot measure" not in message


@pytest.mark.parametrize("available_now", [False, True], ids=["start", "available-now"])
def test_missing_vhost_is_530_not_a_retry_loop(amqp_url: str, names, available_now: bool) -> None:  # type: ignore[no-untyped-def]
    message = _start_fails(_with(amqp_url, vhost="no-such-vhost"), names.queue(), available_now)
    assert "vhost 'no-such-vhost' does not exist" in message and "530 NOT_ALLOWED" in message


@pytest.mark.parametrize("available_now", [False, True], ids=["start", "available-now"])
def test_missing_queue_is_404(amqp_url: str, names, available_now: bool) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    message = _start_fails(amqp_url, q, available_now)
    assert f"queue '{q}'" in message and "404 NOT_FOUND" in message


@pytest.mark.parametrize("available_now", [False, True], ids=["start", "available-now"])
def test_a_stream_queue_is_refused_in_queue_mode_before_any_delivery(amqp_url: str, names, available_now: bool) -> None:  # type: ignore[no-untyped-def]
    # Without x-stream-offset a stream consumer starts at `next`: a, b and c would never be read.
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", q, body)
    conn.close()
    message = _start_fails(amqp_url, q, available_now)
    assert f"queue '{q}' is a stream queue" in message and "option 'stream'" in message, message


def test_a_classic_queue_message_with_a_stream_offset_header_is_read(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    # A message copied out of a stream keeps x-stream-offset: the broker is asked again, and says classic.
    q = names.queue()
    publish(amqp_url, q, [b"copied", b"plain"], headers={"x-stream-offset": 7})
    d = MicroBatchDriver(amqp_url, q, connectionTimeout=30)
    try:
        rows = d.drain(2, timeout=20)
        assert sorted(r["body"] for r in rows) == [b"copied", b"plain"]
        for _ in range(20):  # the type check runs in the background: give it time to (wrongly) fail the query
            d.runtime.latest_offset(d.start, 0)
            time.sleep(0.05)
    finally:
        d.close()


def test_inequivalent_declaration_is_406_not_retried_forever(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(q, durable=True)
    conn.close()
    message = _start_fails(amqp_url, q, declareQueue="true", queueDurable="false")
    assert f"queue '{q}'" in message and "406 PRECONDITION_FAILED" in message and "queueDurable/queueArguments" in message


def test_exclusive_queue_of_another_connection_is_405(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    owner = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        owner.channel().queue_declare(q, exclusive=True)
        message = _start_fails(amqp_url, q)
        assert f"queue '{q}'" in message and "405 RESOURCE_LOCKED" in message
    finally:
        owner.close()


def test_amqps_against_a_plain_port_fails_fast(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    message = _start_fails(amqp_url.replace("amqp://", "amqps://"), names.queue(), **{"tls.checkHostname": "false"})
    assert "TLS handshake" in message and "is it a TLS port" in message


def test_a_queue_name_pamqp_would_refuse_is_consumed(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("café.ünïcode")
    publish(amqp_url, q, [b"m%d" % i for i in range(5)])
    d = MicroBatchDriver(amqp_url, q, connectionTimeout=30)
    try:
        rows = d.drain(5, timeout=20)
        assert sorted(r["body"] for r in rows) == [b"m%d" % i for i in range(5)] and rows[0]["queue"] == q
    finally:
        d.close()


def test_an_exception_on_the_io_thread_fails_the_query_with_it(embedded: EmbeddedBroker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    publish(embedded.url, "q", [b"m%d" % i for i in range(20)])
    d = MicroBatchDriver(embedded.url, "q", connectionTimeout=30)
    try:
        d.runtime.prepare_available_now()

        # Deliveries are built as tuple.__new__(Delivery, ...): a Delivery that is no type breaks that, on the IO thread.
        monkeypatch.setattr(session_module, "Delivery", "not a type")
        began = time.monotonic()
        with pytest.raises(AmqpSourceError, match="is not a type object") as info:
            embedded.drop_connections(name_contains="spark-amqp source")  # deliveries arrive again, through `boom`
            while time.monotonic() - began < 30:  # an AvailableNow run waits for its target: it must not wait forever
                d.runtime.latest_offset(d.start, None)
        assert time.monotonic() - began < FAST
        assert isinstance(info.value.__cause__.__cause__, TypeError)  # type: ignore[union-attr]
    finally:
        d.close()


def test_a_thread_that_fails_and_ends_while_check_runs_keeps_its_error() -> None:
    """The interleaving ci73 met: the I/O thread sets its error and ends while the runner's check() is between its
    look at that error and its look at the thread. The thread's error must come out, not "ended unexpectedly"."""
    session = session_module.ConsumerSession(parse_source_options({"uri": "amqp://127.0.0.1:1/%2F", "queue": "q"}), "run")
    its_own = AmqpSourceError("the broker refused: 'not a type' is not a type object")

    class Ending:
        def is_alive(self) -> bool:  # the thread's last act, then its end, in one step of the runner
            session.fatal = its_own
            return False

    session._thread = Ending()  # type: ignore[assignment]
    with pytest.raises(AmqpSourceError) as info:
        session.check()
    assert info.value is its_own


def test_connect_timeout_leaves_no_logged_in_connection_behind(embedded: EmbeddedBroker) -> None:
    embedded.stall_opens()
    d = MicroBatchDriver(embedded.url, "q", connectionTimeout=1)
    try:
        with pytest.raises(AmqpSourceError, match=r"within connectionTimeout=1s"):
            d.runtime.ensure_started()
        # The source retried a few times; each timed-out attempt closed its socket.
        d.close()
        deadline = time.monotonic() + 10
        while embedded.connection_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert embedded.connection_count() == 0
    finally:
        embedded.stall_opens(False)
        d.close()


@pytest.mark.parametrize("code", [320, 541])
def test_connection_forced_and_internal_error_are_retried(embedded: EmbeddedBroker, code: int) -> None:
    publish(embedded.url, "q", [b"m%d" % i for i in range(10)], message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=5, prefetch=10)
    try:
        start, end = d.plan(max_rows=5)
        d.run_batch(start, end)
        assert embedded.close_connections(code, "injected", name_contains="spark-amqp source") == 1
        rows = d.drain(10, max_rows=5, timeout=30)
        assert sorted(r["message_id"] for r in rows) == sorted(f"id-{i}" for i in range(10))
        # Reconnected: a new consumer, and every message acked on it.
        d.idle_until(
            lambda: d.runtime.intake.sessions_lost >= 1 and embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1}
        )
    finally:
        d.close()


@pytest.fixture(params=["embedded", "rabbitmq-4.3-deny"])
def denying_url(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A broker whose operator denies the deprecated feature transient_nonexcl_queues (RabbitMQ 4.3 permits it by
    default): the embedded broker told to, and the RabbitMQ 4.3 node tools/rabbitmq starts so configured."""
    if request.param == "embedded":
        with EmbeddedBroker(denied_features=("transient_nonexcl_queues",)) as broker:
            yield broker.url
    elif os.environ.get("AMQP_TEST_DENYING_URL"):
        yield os.environ["AMQP_TEST_DENYING_URL"]
    else:
        pytest.skip("AMQP_TEST_DENYING_URL not set: no RabbitMQ that denies transient_nonexcl_queues")


def test_a_deprecated_feature_the_broker_denies_fails_fast_and_says_so(denying_url: str) -> None:
    # RabbitMQ 4.x closes the connection with 541, as for a crash it would be right to retry; the
    # text is what tells them apart, and a retry would loop forever.
    q = f"test.transient.{time.monotonic_ns()}"
    message = _start_fails(denying_url, q, declareQueue="true", queueDurable="false")
    assert "denies the deprecated feature 'transient_nonexcl_queues'" in message and "queueDurable=true" in message, message
    durable = _start_fails(denying_url, q, declareQueue="false")  # nothing declared: the queue is missing, not refused
    assert "not found" in durable
