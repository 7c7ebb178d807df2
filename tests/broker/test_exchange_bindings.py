"""Exchange-to-exchange bindings (exchange.bind / exchange.unbind)."""

from __future__ import annotations

from .helpers import closed_with, ready_count


def test_messages_flow_through_bound_exchanges(amqp_url, ch, names) -> None:  # type: ignore[no-untyped-def]
    src, mid, q, other = names.exchange("src"), names.exchange("mid"), names.queue(), names.queue()
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(mid, "direct")
    ch.queue_declare(q)
    ch.queue_declare(other)
    ch.queue_bind(q, mid, "k")
    ch.queue_bind(other, mid, "other")
    ch.exchange_bind(mid, src, "ignored by fanout")
    ch.confirm_delivery()
    ch.basic_publish(src, "k", b"1")  # fanout to mid, then direct on the message's own key
    assert (ready_count(amqp_url, q), ready_count(amqp_url, other)) == (1, 0)
    ch.exchange_unbind(mid, src, "ignored by fanout")
    ch.basic_publish(src, "k", b"2")
    assert ready_count(amqp_url, q) == 1


def test_a_cycle_delivers_once(amqp_url, ch, names) -> None:  # type: ignore[no-untyped-def]
    a, b, q = names.exchange("a"), names.exchange("b"), names.queue()
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.queue_declare(q)
    ch.exchange_bind(b, a, "")
    ch.exchange_bind(a, b, "")
    ch.queue_bind(q, b, "")
    ch.queue_bind(q, a, "")
    ch.confirm_delivery()
    ch.basic_publish(a, "", b"x")
    assert ready_count(amqp_url, q) == 1


def test_deleting_a_destination_removes_its_bindings(amqp_url, ch, names) -> None:  # type: ignore[no-untyped-def]
    src, dst, q = names.exchange("src"), names.exchange("dst"), names.queue()
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(dst, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, dst)
    ch.exchange_bind(dst, src)
    ch.exchange_delete(dst)
    ch.exchange_declare(dst, "fanout")
    ch.queue_bind(q, dst)
    ch.confirm_delivery()
    ch.basic_publish(src, "", b"x")
    assert ready_count(amqp_url, q) == 0


def test_refusals(conn, names) -> None:  # type: ignore[no-untyped-def]
    missing = names.exchange("missing")
    assert closed_with(lambda: conn.channel().exchange_bind("amq.direct", missing, "k")) == (
        404,
        f"NOT_FOUND - no exchange '{missing}' in vhost '/'",
    )
    assert closed_with(lambda: conn.channel().exchange_bind(missing, "amq.direct", "k")) == (
        404,
        f"NOT_FOUND - no exchange '{missing}' in vhost '/'",
    )
    default = (403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    assert closed_with(lambda: conn.channel().exchange_bind("", "amq.direct", "k")) == default
    assert closed_with(lambda: conn.channel().exchange_bind("amq.direct", "", "k")) == default
    ch = conn.channel()
    ch.exchange_unbind(missing, "amq.direct", "k")  # unbinding what is not there succeeds
    ch.exchange_unbind("amq.fanout", "amq.direct", "never bound")
