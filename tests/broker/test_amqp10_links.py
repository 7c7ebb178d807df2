"""AMQP 1.0 links on the embedded broker and RabbitMQ 4.3 alike: conversions between the protocols, consumer outcomes
and the counts they leave on a redelivery, drain and ``available``, publishing outcomes, the anonymous terminus,
streams, and the management node."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pika
import pytest

from spark_amqp import amqp10
from spark_amqp.amqp10.performatives import Outcome
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Described, Symbol, UByte, UInt
from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.errors import AmqpProtocolError, ConnectionForced

from ..broker.helpers import consume_n
from .amqp10_helpers import declare, delete, embedded, publish, read, run, until, url

__all__ = ["url"]


def test_a_0_9_1_message_reads_over_1_0_as_rabbitmq_converts_it(url: str) -> None:
    q = declare(url)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(
        message_id="m-1", type="order", app_id="shop", priority=3, expiration="60000", headers={"k": "v", "x-custom": 7}
    )
    ch.basic_publish("", q, b"body", props)
    ch.basic_publish("", q, b"plain", pika.BasicProperties())
    conn.close()

    async def body(client: Amqp10Client) -> list[amqp10.Sections]:
        receiver, got = await read(client, f"/queues/{q}", 2)
        receiver.settle(got[0][0], got[-1][0])
        await receiver.detach()
        return [amqp10.sections(payload) for _, payload in got]

    try:
        first, second = run(url, body)
    finally:
        delete(url, q)
    assert first.header == [False, 3, 60000, True, 0]  # no delivery mode: durable false
    assert first.annotations["x-exchange"] == "" and first.annotations["x-routing-key"] == q
    assert first.annotations["x-basic-type"] == "order" and first.annotations["x-custom"] == 7
    assert first.property("message_id") == "m-1" and first.property("group_id") == "shop"
    assert first.application_properties == {"k": "v"} and first.body == b"body"
    assert second.application_properties == {} and second.header[3:] == [True, 0]


def test_a_1_0_message_reads_over_0_9_1_as_rabbitmq_converts_it(url: str) -> None:
    q = declare(url)
    message = amqp10.encode(
        b"hello",
        header=[False, UByte(4), UInt(5000)],
        annotations={Symbol("x-basic-type"): "t", Symbol("x-note"): "n"},
        properties=["id-1", None, None, "subj", "/queues/replies", "c-1", Symbol("text/plain")],
        application_properties={"a": 1, "s": "x"},
    )

    async def body(client: Amqp10Client) -> list[tuple[int, list[Any]]]:
        return await publish(client, f"/queues/{q}", [message])

    try:
        assert [code for code, _ in run(url, body)] == [P.ACCEPTED]
        conn = pika.BlockingConnection(pika.URLParameters(url))
        got = consume_n(conn, conn.channel(), q, 1, auto_ack=True)
        conn.close()
    finally:
        delete(url, q)
    (method, props, payload) = got[0]
    assert payload == b"hello" and (method.exchange, method.routing_key) == ("", q)
    assert (props.message_id, props.correlation_id, props.content_type, props.type) == ("id-1", "c-1", "text/plain", "t")
    assert props.reply_to == "replies" and props.priority == 4 and props.delivery_mode is None  # durable false: none
    assert props.expiration == "5000"
    assert props.headers == {"a": 1, "s": "x", "x-note": "n"}


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_outcomes_requeue_count_and_dead_letter(url: str, kind: str) -> None:
    dlq = declare(url)
    q = declare(url, kind, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})

    async def body(client: Amqp10Client) -> tuple[list[list[Any]], list[dict[str, Any]], int]:
        await publish(client, f"/queues/{q}", [amqp10.encode(b"%d" % i) for i in range(4)])
        receiver, got = await read(client, f"/queues/{q}", 4)
        ids = [d for d, _ in got]
        receiver.settle(ids[0], ids[0], Outcome.RELEASED)
        receiver.settle(ids[1], ids[1], Outcome.modified(True, False))
        receiver.settle(ids[2], ids[2], Outcome.rejected("amqp:internal-error", "no"))
        receiver.settle(ids[3], ids[3], Outcome.modified(False, True))
        await receiver.detach()
        again, back = await read(client, f"/queues/{q}", 2)
        again.settle(back[0][0], back[-1][0])
        await again.detach()
        dead, died = await read(client, f"/queues/{dlq}", 2)
        dead.settle(died[0][0], died[-1][0])
        await dead.detach()
        parts = [amqp10.sections(m) for _, m in back]
        return [s.header for s in parts], [s.annotations for s in parts], len(died)

    try:
        headers, annotations, dead = run(url, body)
    finally:
        delete(url, q, dlq)
    assert dead == 2  # rejected, and modified undeliverable-here
    # released: back uncounted; modified delivery-failed: counted. Both no longer the first acquirer (RabbitMQ 4.3.6).
    assert [h[3:] for h in headers] == [[False, 0], [False, 1]]  # (first-acquirer, delivery-count)
    counts = [(a.get("x-acquired-count"), a.get("x-delivery-count")) for a in annotations]
    assert counts == ([(1, None), (1, 1)] if kind == "quorum" else [(None, None), (None, None)])


def test_drain_spends_the_credit_and_echo_reports_what_is_available(url: str) -> None:
    q = declare(url)

    async def body(client: Amqp10Client) -> tuple[int | None, int, int]:
        await publish(client, f"/queues/{q}", [amqp10.encode(b"x")] * 3)
        got: list[int] = []
        receiver = await client.receiver(f"/queues/{q}", lambda d, payload: got.append(d))
        available = await receiver.echo(credit=0)
        receiver.grant(10, drain=True)
        await until(lambda: receiver.credit == 0 and len(got) == 3)
        count = receiver.delivery_count
        receiver.settle(got[0], got[-1])
        await receiver.detach()
        return available, count, len(got)

    try:
        available, count, n = run(url, body)
    finally:
        delete(url, q)
    assert available == 3 and n == 3 and count == 10  # the drain advanced delivery-count over the unused credit


def test_publishing_outcomes_accepted_released_and_rejected(url: str) -> None:
    q = declare(url, **{"x-max-length": 1, "x-overflow": "reject-publish"})

    async def body(client: Amqp10Client) -> list[tuple[int, list[Any]]]:
        full = await publish(client, f"/queues/{q}", [amqp10.encode(b"a"), amqp10.encode(b"b")])
        lost = await publish(client, f"/exchanges/amq.direct/nobody-{uuid.uuid4().hex}", [amqp10.encode(b"c")])
        return full + lost

    try:
        outcomes = run(url, body)
    finally:
        delete(url, q)
    assert [code for code, _ in outcomes] == [P.ACCEPTED, P.REJECTED, P.RELEASED]
    error = outcomes[1][1][0]
    assert isinstance(error, Described) and error.value[0] == "amqp:resource-limit-exceeded"
    assert error.value[1] == f"queue '{q}' exceeded maximum length"


def test_the_anonymous_terminus_routes_each_message_by_its_to(url: str) -> None:
    q = declare(url)

    def to(address: str) -> bytes:
        return amqp10.encode(address.encode(), properties=[None, None, address])

    async def body(client: Amqp10Client) -> list[tuple[int, list[Any]]]:
        return await publish(client, None, [to(f"/queues/{q}"), to("/exchanges/no-such-exchange/k"), to(f"/exchanges/amq.direct/{q}")])

    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_bind(q, "amq.direct", q)
    conn.close()
    try:
        outcomes = run(url, body)
        conn = pika.BlockingConnection(pika.URLParameters(url))
        got = consume_n(conn, conn.channel(), q, 2, auto_ack=True)
        conn.close()
    finally:
        delete(url, q)
    assert [code for code, _ in outcomes] == [P.ACCEPTED, P.REJECTED, P.ACCEPTED]
    assert outcomes[1][1][0].value[:2] == ["amqp:not-found", "no exchange 'no-such-exchange' in vhost '/'"]
    assert sorted((m.exchange, b) for m, _, b in got) == [
        ("", f"/queues/{q}".encode()),
        ("amq.direct", f"/exchanges/amq.direct/{q}".encode()),
    ]


def test_a_deleted_queue_ends_its_link_saying_so(url: str) -> None:
    q = declare(url)

    async def body(client: Amqp10Client) -> AmqpProtocolError | None:
        receiver = await client.receiver(f"/queues/{q}", lambda d, payload: None)
        receiver.grant(5)
        await asyncio.get_running_loop().run_in_executor(None, delete, url, q)
        return await asyncio.wait_for(receiver.closed, 10)

    reason = run(url, body)
    assert reason is not None and "amqp:resource-deleted" in str(reason)


def test_a_stream_starts_where_the_offset_spec_says_and_annotates_each_offset(url: str) -> None:
    s = declare(url, "stream")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", s, b"m%d" % i, pika.BasicProperties(headers={"x-stream-filter-value": "even" if i % 2 == 0 else "odd"}))
    conn.close()

    def spec(value: Any, **more: Any) -> dict[Any, Any]:
        filters = {Symbol("rabbitmq:stream-offset-spec"): Described(Symbol("rabbitmq:stream-offset-spec"), value)}
        for name, v in more.items():
            key = Symbol(f"rabbitmq:{name.replace('_', '-')}")
            filters[key] = Described(key, v)
        return filters

    async def body(client: Amqp10Client) -> tuple[list[Any], list[Any], Any]:
        out = []
        for value in ("first", 7):
            receiver, got = await read(client, f"/queues/{s}", 10 - (value if isinstance(value, int) else 0), spec(value))
            receiver.settle(got[0][0], got[-1][0])
            await receiver.detach()
            out.append([(amqp10.sections(m).annotations["x-stream-offset"], amqp10.sections(m).body) for _, m in got])
        filtered, got = await read(client, f"/queues/{s}", 1, spec("first", stream_filter="even"))
        source = filtered.attached.result()[5]
        await filtered.detach()
        return out[0], out[1], source

    try:
        everything, tail, source = run(url, body)
    finally:
        delete(url, s)
    assert everything == [(i, b"m%d" % i) for i in range(10)]
    assert tail == [(i, b"m%d" % i) for i in range(7, 10)]
    assert source.value[6] == "copy"  # a stream's link copies
    assert set(source.value[7]) == {"rabbitmq:stream-offset-spec", "rabbitmq:stream-filter"}  # the filters it took


def test_the_management_node_declares_reads_and_deletes_queues(url: str) -> None:
    q = f"b10-mgmt-{uuid.uuid4().hex[:8]}"

    async def body(client: Amqp10Client) -> list[tuple[int, Any]]:
        path = f"/queues/{q}"
        answers = [await client.management_request("GET", path)]
        answers.append(await client.management_request("PUT", path, {"durable": True, "arguments": {"x-queue-type": "quorum"}}))
        answers.append(await client.management_request("PUT", path, {"durable": True, "arguments": {"x-queue-type": "quorum"}}))
        answers.append(await client.management_request("PUT", path, {"durable": True, "arguments": {"x-queue-type": "classic"}}))
        answers.append(await client.management_request("GET", path))
        answers.append(await client.management_request("DELETE", path))
        return answers

    missing, created, again, conflict, info, deleted = run(url, body)
    assert missing == (404, f"queue '{q}' in vhost '/' not found")
    assert created[0] == 201 and again[0] == 200 and conflict[0] == 409 and "x-queue-type" in conflict[1]
    assert info[0] == 200 and {k: info[1][k] for k in ("type", "durable", "message_count", "consumer_count", "name")} == {
        "type": "quorum",
        "durable": True,
        "message_count": 0,
        "consumer_count": 0,
        "name": q,
    }
    assert deleted == (200, {"message_count": 0})


def test_a_dropped_connection_sends_its_unsettled_deliveries_back(embedded_broker: Any) -> None:
    url = embedded_broker.url
    q = declare(url)

    async def body(client: Amqp10Client) -> None:
        await publish(client, f"/queues/{q}", [amqp10.encode(b"x")] * 5)
        receiver, got = await read(client, f"/queues/{q}", 5)
        receiver.settle(got[0][0], got[1][0])  # two settled, three not
        await until(lambda: embedded_broker.queue_stats(q)["unacked"] == 3)
        assert embedded_broker.drop_connections(name_contains="broker-test") == 1
        await asyncio.wait_for(client.closed, 10)

    try:
        run(url, body)
    except AmqpProtocolError:
        pass
    assert embedded(url)
    assert embedded_broker.queue_stats(q) == {"ready": 3, "unacked": 0, "consumers": 0}


@pytest.fixture
def embedded_broker(embedded: Any) -> Any:
    return embedded


def test_a_message_published_over_1_0_to_a_stream_reads_over_both_protocols(url: str) -> None:
    s = declare(url, "stream")
    message = amqp10.encode(
        b"a",
        header=[True, UByte(4)],
        annotations={Symbol("x-stream-filter-value"): "f", Symbol("x-foo"): "bar"},
        properties=["id1"],
        application_properties={"k": 1},
    )
    first = {Symbol("rabbitmq:stream-offset-spec"): Described(Symbol("rabbitmq:stream-offset-spec"), "first")}

    async def body(client: Amqp10Client) -> amqp10.Sections:
        assert [code for code, _ in await publish(client, f"/queues/{s}", [message, amqp10.encode(b"b")])] == [P.ACCEPTED] * 2
        receiver, got = await read(client, f"/queues/{s}", 2, first)
        await receiver.detach()
        return [amqp10.sections(m) for _, m in got]

    try:
        over_10 = run(url, body)
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        over_091 = consume_n(conn, ch, s, 2, arguments={"x-stream-offset": "first"})
        conn.close()
    finally:
        delete(url, s)
    assert [x.header for x in over_10] == [[True, 4, None, True, 0], [False, None, None, True, 0]]  # no header: not durable
    assert list(over_10[0].annotations.items()) == [
        ("x-stream-offset", 0),
        ("x-routing-key", s),
        ("x-exchange", ""),
        ("x-stream-filter-value", "f"),
        ("x-foo", "bar"),
    ]
    props = [p for _, p, _ in over_091]
    assert [p.delivery_mode for p in props] == [2, 1] and props[0].priority == 4 and props[0].message_id == "id1"
    assert props[0].headers == {"k": 1, "x-foo": "bar", "x-stream-filter-value": "f", "x-stream-offset": 0}


def test_a_dead_lettered_message_carries_its_deaths_as_rabbitmq_4_3_annotates_them(url: str) -> None:
    dlq = declare(url)
    q = declare(url, "quorum", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})

    async def body(client: Amqp10Client) -> list[amqp10.Sections]:
        await publish(client, f"/queues/{q}", [amqp10.encode(b"a", properties=["id"], application_properties={"k": 1})])
        receiver, got = await read(client, f"/queues/{q}", 1)
        receiver.settle(got[0][0], got[0][0], Outcome.rejected("amqp:internal-error", "no"))
        await receiver.detach()
        dead, died = await read(client, f"/queues/{dlq}", 1)
        dead.settle(died[0][0], died[0][0])
        await dead.detach()
        return [amqp10.sections(m) for _, m in died]

    try:
        (message,) = run(url, body)
    finally:
        delete(url, q, dlq)
    # A rejection is a failed delivery: the copy's delivery-count says so (RabbitMQ 4.3.6 carries its count along).
    assert message.header == [False, None, None, False, 1]
    assert message.property("message_id") == "id" and message.application_properties == {"k": 1}
    annotations = message.annotations
    assert "x-death" not in annotations and [k for k in annotations][:6] == [
        "x-last-death-reason",
        "x-last-death-queue",
        "x-last-death-exchange",
        "x-first-death-reason",
        "x-first-death-queue",
        "x-first-death-exchange",
    ]
    (death,) = annotations["x-opt-deaths"]
    assert {k: death[k] for k in ("queue", "reason", "count", "exchange", "routing-keys")} == {
        "queue": q,
        "reason": "rejected",
        "count": 1,
        "exchange": "",
        "routing-keys": [q],
    }
    assert annotations["x-routing-key"] == dlq and annotations["x-exchange"] == ""


def test_an_alarm_holds_publishers_credit_and_outcomes_until_it_clears(embedded_broker: Any) -> None:
    url = embedded_broker.url
    q = declare(url)

    async def body(client: Amqp10Client) -> tuple[int, int, int]:
        outcomes: list[int] = []
        sender = await client.sender(f"/queues/{q}", lambda first, last, code, values: outcomes.extend(range(first, last + 1)))
        await until(lambda: sender.credit > 0)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, embedded_broker.raise_alarm)
        while sender.credit > 0:
            sender.send(amqp10.encode(b"x"))
        await asyncio.sleep(0.3)
        held, credit = len(outcomes), sender.credit
        await loop.run_in_executor(None, embedded_broker.clear_alarm)
        await until(lambda: sender.credit > 0 and len(outcomes) == 170)
        return held, credit, len(outcomes)

    assert run(url, body) == (0, 0, 170)  # no outcome and no credit while the alarm lasts


def test_fault_injection_reaches_amqp_1_0_connections(embedded_broker: Any) -> None:
    url = embedded_broker.url

    async def closed(client: Amqp10Client) -> Any:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, lambda: embedded_broker.close_connections(320, "shutting down")) == 1
        return await asyncio.wait_for(client.closed, 10)

    reason = run(url, closed)
    assert isinstance(reason, ConnectionForced) and "amqp:connection:forced" in str(reason)
    assert embedded_broker.amqp10_connection_count() == 0

    embedded_broker.stall_opens()
    started = time.monotonic()
    with pytest.raises(AmqpProtocolError):
        run(url, lambda client: asyncio.sleep(0), connectionTimeout="1")
    assert time.monotonic() - started < 5
    embedded_broker.stall_opens(False)

    embedded_broker.refuse_connections(5)
    with pytest.raises(AmqpProtocolError):
        run(url, lambda client: asyncio.sleep(0), connectionTimeout="1")


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_0_9_1_reject_counts_a_failed_delivery_on_the_dead_copy_and_a_nack_does_not(url: str, kind: str) -> None:
    dlq = declare(url)
    q = declare(url, kind, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"rejected")
    ch.basic_publish("", q, b"nacked")
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _, _ = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=False)
    conn.close()

    async def body(client: Amqp10Client) -> list[tuple[bytes | None, int]]:
        receiver, got = await read(client, f"/queues/{dlq}", 2)
        receiver.settle(got[0][0], got[-1][0])
        await receiver.detach()
        return [(amqp10.sections(m).body, amqp10.sections(m).header[4]) for _, m in got]

    try:
        assert run(url, body) == [(b"rejected", 1), (b"nacked", 0)]
    finally:
        delete(url, q, dlq)


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_unsettled_deliveries_come_back_counted_but_a_quorum_queue_does_not_count_a_detach(url: str, kind: str) -> None:
    q = declare(url, kind)

    async def hold(client: Amqp10Client, detach: bool) -> None:
        await publish(client, f"/queues/{q}", [amqp10.encode(b"x")])
        receiver, _ = await read(client, f"/queues/{q}", 1)
        if detach:
            await receiver.detach()  # else the connection closes with it unsettled

    async def again(client: Amqp10Client) -> tuple[list[Any], Any, Any]:
        receiver, got = await read(client, f"/queues/{q}", 1)
        receiver.settle(got[0][0], got[0][0])
        await receiver.detach()
        parts = amqp10.sections(got[0][1])
        return parts.header[3:], parts.annotations.get("x-acquired-count"), parts.annotations.get("x-delivery-count")

    try:
        run(url, lambda client: hold(client, True))
        after_detach = run(url, again)
        run(url, lambda client: hold(client, False))
        after_close = run(url, again)
    finally:
        delete(url, q)
    # (first-acquirer and delivery-count, x-acquired-count, x-delivery-count), measured on RabbitMQ 4.3.6
    if kind == "quorum":
        assert (after_detach, after_close) == (([False, 0], 1, None), ([False, 1], 1, 1))
    else:
        assert (after_detach, after_close) == (([False, 1], None, None), ([False, 1], None, None))
