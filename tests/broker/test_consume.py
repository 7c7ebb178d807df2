"""Consumers, prefetch, delivery tags, acknowledgements and requeueing."""

from __future__ import annotations

import time

import pika
import pytest

from .helpers import connect, consume_n, drain, ready_count, wait_for


def _filled(conn, names, n: int) -> tuple[object, str]:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", q, b"%d" % i)
    return ch, q


def _settled(conn, got: list, expected: int) -> int:  # type: ignore[no-untyped-def,type-arg]
    """How many deliveries ``got`` holds once it reached ``expected`` (waited for: a loaded broker is slow)
    and 0.5 s more passed, room for any delivery past a limit."""
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got) >= expected)
    conn.process_data_events(time_limit=0.5)
    return len(got)


def test_delivery_tags_increase_per_channel(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch1, q = _filled(conn, names, 6)
    ch2 = conn.channel()
    ch1.basic_qos(prefetch_count=3)
    got1 = consume_n(conn, ch1, q, 3)
    got2 = drain(ch2, q, ack=False)
    assert [m.delivery_tag for m, _, _ in got1] == [1, 2, 3]
    assert [m.delivery_tag for m, _, _ in got2] == [1, 2, 3]  # each channel counts from 1
    assert [b for _, _, b in got1 + got2] == [b"%d" % i for i in range(6)]


def test_per_consumer_prefetch_limits_unacked(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 10)
    ch.basic_qos(prefetch_count=3)
    got: list = []  # type: ignore[type-arg]
    ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    assert _settled(conn, got, 3) == 3
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    assert _settled(conn, got, 6) == 6


def test_global_prefetch_is_shared_by_the_channel_until_4_3(conn, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 10)
    ch.basic_qos(prefetch_count=4, global_qos=True)
    got: list = []  # type: ignore[type-arg]
    ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    # 4.3 denies the deprecated feature global_qos by default and takes the limit per consumer.
    expected = 8 if broker_version >= (4, 3) else 4
    assert _settled(conn, got, expected) == expected


def test_round_robin_between_consumers(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 0)
    seen: dict[str, int] = {}

    def on(c, m, p, b) -> None:  # type: ignore[no-untyped-def]
        seen[m.consumer_tag] = seen.get(m.consumer_tag, 0) + 1
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on, consumer_tag="a")
    ch.basic_consume(q, on, consumer_tag="b")
    for _i in range(10):
        ch.basic_publish("", q, b"x")
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or sum(seen.values()) == 10)
    assert seen == {"a": 5, "b": 5}


def test_ack_multiple_and_single(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 5)
    got = drain(ch, q, ack=False)
    ch.basic_ack(got[2][0].delivery_tag, multiple=True)  # 1..3
    ch.basic_ack(got[4][0].delivery_tag)  # 5
    conn.channel().close()  # a round trip, so the acks were processed
    ch.close()  # 4 goes back
    assert [b for _, _, b in drain(conn.channel(), q)] == [b"3"]


def test_unknown_and_double_ack_are_406(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 2)
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 406 and "unknown delivery tag" in info.value.reply_text


def test_multiple_ack_of_zero_acks_everything(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 4)
    drain(ch, q, ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert ready_count(amqp_url, q) == 0


def test_ack_on_another_channel_is_406(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 1)
    method, _, _ = ch.basic_get(q)
    other = conn.channel()
    other.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.queue_declare(q, passive=True)
    assert info.value.reply_code == 406


def test_nack_requeue_returns_to_original_position_flagged(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 5)
    got = drain(ch, q, limit=3, ack=False)  # 0,1,2 out; 3,4 ready
    ch.basic_nack(got[1][0].delivery_tag, multiple=True, requeue=True)  # 0,1 back
    ch.basic_reject(got[2][0].delivery_tag, requeue=True)  # 2 back
    again = drain(ch, q)
    assert [b for _, _, b in again] == [b"0", b"1", b"2", b"3", b"4"]
    assert [m.redelivered for m, _, _ in again] == [True, True, True, False, False]


def test_nack_without_requeue_drops(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 2)
    got = drain(ch, q, ack=False)
    ch.basic_nack(got[1][0].delivery_tag, multiple=True, requeue=False)
    ch.close()
    assert ready_count(amqp_url, q) == 0


def test_unacked_requeued_when_channel_closes(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 3)
    consume_n(conn, ch, q, 3)
    assert ready_count(amqp_url, q) == 0
    ch.close()
    again = drain(conn.channel(), q)
    assert [b for _, _, b in again] == [b"0", b"1", b"2"] and all(m.redelivered for m, _, _ in again)


def test_unacked_requeued_when_connection_closes(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    ch, q = _filled(conn, names, 3)
    drain(ch, q, ack=False)
    conn.close()
    assert wait_for(lambda: ready_count(amqp_url, q) == 3)


def test_basic_get_empty_and_message_count(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 2)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"0" and method.message_count == 1
    ch.basic_get(q, auto_ack=True)
    assert ch.basic_get(q)[0] is None


def test_no_ack_consumer_needs_no_acks(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 5)
    ch.basic_qos(prefetch_count=1)  # prefetch does not apply to no-ack consumers
    got = consume_n(conn, ch, q, 5, auto_ack=True)
    assert len(got) == 5
    ch.close()
    assert ready_count(amqp_url, q) == 0


def test_recover_requeues_and_requeue_false_is_not_implemented(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 2)
    drain(ch, q, ack=False)
    ch.basic_recover(requeue=True)
    again = drain(ch, q)
    assert [b for _, _, b in again] == [b"0", b"1"] and all(m.redelivered for m, _, _ in again)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.basic_recover(requeue=False)
    assert info.value.reply_code == 540


def test_exclusive_consumer(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 0)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().basic_consume(q, lambda *a: None)
    assert info.value.reply_code == 403 and "exclusive use" in info.value.reply_text


def test_exclusive_consume_refused_when_others_exist(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 0)
    ch.basic_consume(q, lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().basic_consume(q, lambda *a: None, exclusive=True)
    assert info.value.reply_code == 403


def test_cancel_keeps_unacked_until_channel_closes(amqp_url: str, conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 2)
    got = consume_n(conn, ch, q, 2)  # consumes then cancels
    assert len(got) == 2 and ready_count(amqp_url, q) == 0
    ch.basic_ack(got[1][0].delivery_tag, multiple=True)  # acks after cancel are valid
    ch.close()
    assert ready_count(amqp_url, q) == 0


def test_server_cancels_consumer_when_queue_deleted(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 0)
    cancelled: list = []  # type: ignore[type-arg]
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or cancelled)
    assert cancelled == [tag]


def test_duplicate_consumer_tag_is_530(conn, names) -> None:  # type: ignore[no-untyped-def]
    from pamqp import commands

    from ..rawclient import RawClient

    _, q = _filled(conn, names, 0)
    client = RawClient(conn._impl.params and _url(conn))
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.send(1, commands.Basic.Consume(queue=q, consumer_tag="dup"))
    client.read_method()
    client.send(1, commands.Basic.Consume(queue=q, consumer_tag="dup"))
    _, close = client.read_method()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 530


def _url(conn) -> str:  # type: ignore[no-untyped-def]
    p = conn._impl.params
    return f"amqp://{p.credentials.username}:{p.credentials.password}@{p.host}:{p.port}/%2F"


def test_deliveries_flow_while_publishing(conn, names) -> None:  # type: ignore[no-untyped-def]
    ch, q = _filled(conn, names, 0)
    ch.basic_qos(prefetch_count=50)
    got: list[bytes] = []

    def on(c, m, p, b) -> None:  # type: ignore[no-untyped-def]
        got.append(b)
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on)
    pub = conn.channel()
    for i in range(500):
        pub.basic_publish("", q, b"%d" % i)
    deadline = time.monotonic() + 10
    while len(got) < 500 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == [b"%d" % i for i in range(500)]
