"""Exchange declaration and routing by type."""

from __future__ import annotations

import pika
import pytest

from .helpers import connect, drain


@pytest.fixture
def ch(amqp_url: str):  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    yield conn.channel()
    if conn.is_open:
        conn.close()


def _bodies(ch, q: str) -> list[bytes]:  # type: ignore[no-untyped-def]
    return sorted(body for _, _, body in drain(ch, q))


def test_default_exchange_routes_by_queue_name(ch, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", "test.nowhere", b"b")
    assert _bodies(ch, q) == [b"a"]


def test_direct_exchange(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q1, q2 = names.exchange(), names.queue(), names.queue()
    ch.exchange_declare(x, "direct")
    for q, key in ((q1, "k1"), (q2, "k2")):
        ch.queue_declare(q)
        ch.queue_bind(q, x, key)
    ch.queue_bind(q2, x, "k1")
    ch.basic_publish(x, "k1", b"one")
    ch.basic_publish(x, "k2", b"two")
    ch.basic_publish(x, "k3", b"none")
    assert _bodies(ch, q1) == [b"one"]
    assert _bodies(ch, q2) == [b"one", b"two"]


def test_fanout_exchange_ignores_key(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q1, q2 = names.exchange(), names.queue(), names.queue()
    ch.exchange_declare(x, "fanout")
    for q in (q1, q2):
        ch.queue_declare(q)
        ch.queue_bind(q, x, "ignored")
    ch.basic_publish(x, "anything", b"m")
    assert _bodies(ch, q1) == [b"m"] and _bodies(ch, q2) == [b"m"]


@pytest.mark.parametrize(
    ("pattern", "key", "match"),
    [
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#.c", "c", True),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("a.#.c", "ac", False),
        ("#", "", True),
        ("*", "a.b", False),
        ("a.b", "a.b", True),
    ],
)
def test_topic_exchange(ch, names, pattern: str, key: str, match: bool) -> None:  # type: ignore[no-untyped-def]
    x, q = names.exchange(), names.queue()
    ch.exchange_declare(x, "topic")
    ch.queue_declare(q)
    ch.queue_bind(q, x, pattern)
    ch.basic_publish(x, key, b"m")
    assert (_bodies(ch, q) == [b"m"]) is match


def test_headers_exchange_all_and_any(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q_all, q_any, q_void = names.exchange(), names.queue(), names.queue(), names.queue()
    ch.exchange_declare(x, "headers")
    for q in (q_all, q_any, q_void):
        ch.queue_declare(q)
    ch.queue_bind(q_all, x, "", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, x, "", arguments={"x-match": "any", "format": "pdf", "type": "log"})
    ch.queue_bind(q_void, x, "", arguments={"x-match": "all", "flag": None})

    def pub(body: bytes, headers: dict) -> None:  # type: ignore[type-arg]
        ch.basic_publish(x, "", body, pika.BasicProperties(headers=headers))

    pub(b"both", {"format": "pdf", "type": "report"})
    pub(b"fmt", {"format": "pdf"})
    pub(b"log", {"type": "log", "flag": 1})
    pub(b"none", {})
    assert _bodies(ch, q_all) == [b"both"]
    assert _bodies(ch, q_any) == [b"both", b"fmt", b"log"]
    assert _bodies(ch, q_void) == [b"log"]


def test_system_exchanges_exist(ch) -> None:  # type: ignore[no-untyped-def]
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        ch.exchange_declare(name, passive=True)


def test_amq_bound_queue_receives(ch, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.topic", "t.#")
    ch.basic_publish("amq.topic", "t.x", b"m")
    assert _bodies(ch, q) == [b"m"]


@pytest.mark.parametrize(
    ("action", "code"),
    [
        (lambda ch, n: ch.exchange_declare("amq.custom"), 403),
        (lambda ch, n: ch.exchange_declare(""), 403),
        (lambda ch, n: ch.exchange_delete("amq.direct"), 403),
        (lambda ch, n: ch.exchange_declare("test.missing.exchange", passive=True), 404),
        (lambda ch, n: ch.basic_publish("test.missing.exchange", "k", b"m") or ch.queue_declare("", exclusive=True), 404),
    ],
)
def test_exchange_channel_errors(ch, names, action, code: int) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(ch, names)
    assert info.value.reply_code == code


def test_inequivalent_redeclare_is_406(ch, names) -> None:  # type: ignore[no-untyped-def]
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    ch.exchange_declare(x, "direct")  # same properties: fine
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, "fanout")
    assert info.value.reply_code == 406 and "inequivalent arg 'type'" in info.value.reply_text


def test_unknown_exchange_type_is_refused(amqp_url: str, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    # 3.10 closed the connection with 503 COMMAND_INVALID; 4.x closes only the channel, with 406.
    closed = pika.exceptions.ChannelClosedByBroker if broker_version >= (4, 0) else pika.exceptions.ConnectionClosedByBroker
    code = 406 if broker_version >= (4, 0) else 503
    with pytest.raises(closed) as info:
        conn.channel().exchange_declare(names.exchange(), "ZZwwInvalid")
    reply = "PRECONDITION_FAILED" if code == 406 else "COMMAND_INVALID"
    assert (info.value.reply_code, info.value.reply_text) == (code, f"{reply} - unknown exchange type 'ZZwwInvalid'")
    if conn.is_open:
        conn.close()


def test_delete_if_unused_and_missing(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q = names.exchange(), names.queue()
    ch.exchange_declare(x, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k")
    ch.exchange_delete("test.missing.exchange")  # deleting nothing is fine
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_delete(x, if_unused=True)
    assert info.value.reply_code == 406


def test_delete_removes_bindings(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q = names.exchange(), names.queue()
    ch.exchange_declare(x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "")
    ch.exchange_delete(x)
    ch.exchange_declare(x, "fanout")
    ch.basic_publish(x, "", b"m")
    assert _bodies(ch, q) == []


def test_auto_delete_exchange_goes_with_last_binding(ch, names) -> None:  # type: ignore[no-untyped-def]
    x, q = names.exchange(), names.queue()
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k")
    ch.queue_unbind(q, x, "k")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, passive=True)
    assert info.value.reply_code == 404


def test_binding_to_default_exchange_is_403(ch, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch.queue_declare(q)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind(q, "", "k")
    assert info.value.reply_code == 403
