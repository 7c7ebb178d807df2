"""The sink over AMQP 1.0 (``protocol=amqp1.0``) without Spark, on every RabbitMQ 4.x in the run: the messages an
AMQP 0-9-1 consumer gets are the ones the AMQP 0-9-1 sink publishes; every outcome but ``accepted`` fails the task,
saying why."""

from __future__ import annotations

import asyncio
import datetime
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pika
import pyarrow as pa
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.errors import AmqpOptionError, AmqpPublishError
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder, address_of
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.options import parse_sink_options

from .. import amqp10_fixtures
from ..broker.helpers import consume_n, ready_count, wait_for
from ..brokers import drop_source_connections
from .helpers import both_nodes, publish_table

# The fixtures each RabbitMQ 4.x and its fresh queues (tests/amqp10_fixtures.py).
url = amqp10_fixtures.url
queues = amqp10_fixtures.queues


def publish10(url: str, table: dict[str, Any], **options: str) -> Any:
    return publish10_batches(url, [pa.RecordBatch.from_pydict(table)], **options)


def publish10_batches(url: str, batches: Iterable[pa.RecordBatch], **options: str) -> Any:
    opts = parse_sink_options({"uri": url, "protocol": "amqp1.0", **options})
    return asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts)).publish(batches, "test"))


def _consume(url: str, queue: str, n: int) -> list[tuple[Any, Any, bytes]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    # Returns once n arrived; the time allowed is for a loaded machine (20,000 from the embedded broker took more
    # than 10 s in a CI lane).
    got = consume_n(conn, ch, queue, n, timeout=90, auto_ack=True)
    conn.close()
    return got


WHEN = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
TABLE: dict[str, Any] = {
    "body": [b"plain", b"x" * 300, b""],
    "message_id": ["m-1", None, "m-3"],
    "correlation_id": ["c-1", None, None],
    "content_type": ["application/json", None, None],
    "content_encoding": ["gzip", None, None],
    "type": ["order", None, None],
    "app_id": ["shop", None, None],
    "user_id": ["guest", None, None],
    "reply_to": ["replies", None, None],
    "expiration": ["60000", None, None],
    "priority": [3, None, 0],
    "delivery_mode": [2, None, 1],
    "timestamp": [WHEN, None, None],
    "headers": pa.array([[("s", "text"), ("n", "7")], None, []], pa.map_(pa.string(), pa.string())),
}


def test_a_consumer_gets_what_the_amqp_0_9_1_sink_publishes(url: str, queues: Any) -> None:
    over_091, over_10 = queues(), queues()
    publish_table(url, TABLE, routingKey=over_091)
    result = publish10(url, TABLE, routingKey=over_10)
    assert (result.published, result.confirmed) == (3, 3)
    expected, got = _consume(url, over_091, 3), _consume(url, over_10, 3)
    assert [b for _, _, b in got] == [b for _, _, b in expected]
    fields = ("message_id", "correlation_id", "content_type", "content_encoding", "type", "app_id", "user_id", "reply_to")
    fields += ("expiration", "priority", "delivery_mode", "timestamp", "headers")
    for (_, p10, _), (_, p091, _) in zip(got, expected, strict=True):
        differ = {f: (getattr(p10, f), getattr(p091, f)) for f in fields if getattr(p10, f) != getattr(p091, f)}
        # What RabbitMQ's conversion from AMQP 1.0 cannot carry: an empty header map is no application-properties
        # section (the consumer sees none); delivery mode 1 is the header's durable=false, which it reads as none.
        assert differ in ({}, {"headers": (None, {}), "delivery_mode": (None, 1)}), differ


def test_through_an_exchange_with_each_rows_routing_key(url: str, queues: Any) -> None:
    orders, refunds = queues(), queues()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    exchange = f"a10x-{uuid.uuid4().hex[:8]}"
    ch.exchange_declare(exchange, "direct", auto_delete=True)
    ch.queue_bind(orders, exchange, "order/new")  # a '/' in the key: the address percent-encodes it
    ch.queue_bind(refunds, exchange, "refund")
    try:
        publish10(url, {"body": [b"a", b"b", b"c"], "routing_key": ["order/new", "refund", "order/new"]}, exchange=exchange)
        assert sorted(b for _, _, b in _consume(url, orders, 2)) == [b"a", b"c"]
        got = _consume(url, refunds, 1)
        assert [(m.exchange, m.routing_key, b) for m, _, b in got] == [(exchange, "refund", b"b")]
    finally:
        ch.exchange_delete(exchange)
        conn.close()


def test_an_unroutable_message_fails_the_task_unless_mandatory_is_off(url: str, queues: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    exchange = f"a10x-{uuid.uuid4().hex[:8]}"
    conn.channel().exchange_declare(exchange, "direct", auto_delete=False)
    try:
        with pytest.raises(AmqpPublishError, match=r"2 released as unroutable .*first: '/exchanges/a10x-\w+/nobody'.* of 2 messages"):
            publish10(url, {"body": [b"a", b"b"]}, exchange=exchange, routingKey="nobody")
        result = publish10(url, {"body": [b"a", b"b"]}, exchange=exchange, routingKey="nobody", mandatory="false")
        assert (result.published, result.confirmed) == (2, 2)
    finally:
        conn.channel().exchange_delete(exchange)
        conn.close()


def test_a_missing_exchange_fails_the_task_naming_it(url: str) -> None:
    with pytest.raises(AmqpPublishError, match=r"(not.found|not_found).*no-such-exchange|no-such-exchange.*(not.found|not_found)"):
        publish10(url, {"body": [b"a"]}, exchange="no-such-exchange", routingKey="k")


def test_a_rejected_message_names_the_queue_and_the_reason(url: str, queues: Any) -> None:
    full = queues("classic", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    with pytest.raises(AmqpPublishError, match=rf"1 refused by the broker \(first: /queues/{full}: rejected \(.*\)\) of 2 messages"):
        publish10(url, {"body": [b"a", b"b"]}, routingKey=full, maxInFlight="1")


def test_a_message_larger_than_a_frame_goes_in_several_transfers(url: str, queues: Any) -> None:
    q = queues()
    big = bytes(range(256)) * 12_000  # 3 MB: several of RabbitMQ's frames
    publish10(url, {"body": [big, b"small"]}, routingKey=q)
    assert [b for _, _, b in _consume(url, q, 2)] == [big, b"small"]


def test_a_window_of_one_publishes_every_message_in_order(url: str, queues: Any) -> None:
    q = queues()
    result = publish10(url, {"body": [b"%d" % i for i in range(200)]}, routingKey=q, maxInFlight="1")
    assert result.confirmed == 200
    assert [b for _, _, b in _consume(url, q, 200)] == [b"%d" % i for i in range(200)]


def test_a_window_beyond_the_brokers_link_credit_spreads_over_links_and_keeps_the_order(url: str, queues: Any) -> None:
    # RabbitMQ grants a publishing link 170 credits, topped up only while fewer than 170 of its messages wait for their
    # queues: the sink opens more links of one session to keep maxInFlight unsettled, and the queue keeps row order.
    for kind in ("classic", "quorum"):
        q = queues(kind)
        bodies = [b"%d" % i for i in range(20_000)]
        result = publish10(url, {"body": bodies}, routingKey=q, maxInFlight="1000")
        assert (result.published, result.confirmed) == (20_000, 20_000)
        assert [b for _, _, b in _consume(url, q, 20_000)] == bodies


def test_runs_of_messages_across_the_delivery_id_wrap(url: str, queues: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sink sends a run of messages in one write, numbering them from the session's next delivery id: a run that
    # crosses 2**32 wraps to 0, and an outcome for an id after the wrap still names its message's queue.
    opened = Amqp10Client.__init__

    def near_the_wrap(self: Amqp10Client, *args: Any, **kwargs: Any) -> None:
        opened(self, *args, **kwargs)
        self._next_delivery = self.next_outgoing_id = (1 << 32) - 100

    monkeypatch.setattr(Amqp10Client, "__init__", near_the_wrap)
    q = queues()
    bodies = [b"%d" % i for i in range(600)]
    assert publish10(url, {"body": bodies}, routingKey=q).confirmed == 600
    assert [b for _, _, b in _consume(url, q, 600)] == bodies
    full = queues("classic", **{"x-max-length": 300, "x-overflow": "reject-publish"})
    with pytest.raises(AmqpPublishError, match=rf"refused by the broker \(first: /queues/{full}: rejected"):
        publish10(url, {"body": bodies}, routingKey=full)


@pytest.mark.parametrize(("window", "reached"), [("1000", 500), ("400", 400)])
def test_held_outcomes_open_links_up_to_the_window(embedded: EmbeddedBroker, window: str, reached: int) -> None:
    # The embedded broker's confirms held: each link stops at its 170 credits, so 500 messages on the queue before
    # any outcome means three links; a window of 400 still stops at 400.
    conn = pika.BlockingConnection(pika.URLParameters(embedded.url))
    conn.channel().queue_declare("held", durable=True)
    conn.close()
    results: list[Any] = []
    embedded.hold_confirms()
    try:
        thread = threading.Thread(
            target=lambda: results.append(publish10(embedded.url, {"body": [b"x"] * 500}, routingKey="held", maxInFlight=window))
        )
        thread.start()
        wait_for(lambda: embedded.queue_stats("held")["ready"] == reached, timeout=30)
        assert thread.is_alive() and not results  # every outcome is still held
    finally:
        embedded.release_confirms()
    thread.join(30)
    assert results and results[0].confirmed == 500
    assert embedded.queue_stats("held")["ready"] == 500


def test_a_connection_lost_mid_partition_is_replaced_and_what_it_had_not_settled_published_again(
    url: str, queues: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The partition's second batch waits until the test has cut the connection, so the cut always lands mid-partition,
    # with the first batch's last messages (up to maxInFlight) written and not yet settled as far as the task knows.
    # Racing a running partition instead (ci on record) lost on a loaded machine: 300,000 rows were all published
    # before rabbitmqctl could list the connection.
    q = queues()
    size, batches = 5_000, 4
    n = size * batches
    sent_first, cut = threading.Event(), threading.Event()
    results: list[Any] = []
    failure: list[BaseException] = []

    def partition() -> Iterator[pa.RecordBatch]:
        for k in range(batches):
            if k == 1:
                sent_first.set()
                if not cut.wait(120):
                    raise TimeoutError("the test never cut the connection")
            yield pa.RecordBatch.from_pydict({"body": [b"%d" % (k * size + i) for i in range(size)]})

    def run() -> None:
        try:
            results.append(publish10_batches(url, partition(), routingKey=q))
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=run)
    with caplog.at_level("WARNING", logger="spark_amqp.sink"):
        thread.start()
        try:
            assert sent_first.wait(120), failure
            assert drop_source_connections(url, None, "spark-amqp sink") == 1
        finally:
            cut.set()
            thread.join(180)
    assert not failure and results and (results[0].published, results[0].confirmed) == (n, n), failure
    assert "connecting again" in caplog.text and "ended the link or the connection" in caplog.text
    ready = ready_count(url, q)
    # Every message; those the lost connection had not settled (at most maxInFlight) may be there twice.
    assert n <= ready <= n + 1000, ready
    assert {body for _, _, body in _consume(url, q, ready)} == {b"%d" % i for i in range(n)}


def test_a_node_that_stops_settling_is_left_for_another_of_the_uri(embedded: EmbeddedBroker, listed: None) -> None:
    # As over AMQP 0-9-1 (tests/sink/test_publisher.py): after confirmTimeout without an outcome the task connects
    # again, to the uri's other node first, and publishes there what the first had not settled.
    with EmbeddedBroker() as other:
        for broker in (embedded, other):
            conn = pika.BlockingConnection(pika.URLParameters(broker.url))
            conn.channel().queue_declare("q")
            conn.close()
        embedded.hold_confirms()
        bodies = [b"m%d" % i for i in range(40)]
        result = publish10(
            both_nodes(embedded, other), {"body": bodies}, routingKey="q", maxInFlight="10", confirmTimeout="0.5", brokerOutageTimeout="10s"
        )
        embedded.release_confirms()
        assert (result.published, result.confirmed) == (40, 40)
        assert [body for _, _, body in _consume(other.url, "q", 40)] == bodies  # the 10 unsettled, then the rest
        assert embedded.queue_stats("q")["ready"] == 10  # what the node took but never settled: at least once


def test_options_over_amqp_1_0() -> None:
    base = {"uri": "amqp://guest@localhost/", "protocol": "amqp1.0"}
    with pytest.raises(AmqpOptionError, match="option 'superStream' is for AMQP 0-9-1 and the stream protocol"):
        parse_sink_options({**base, "superStream": "s"})
    assert parse_sink_options({**base, "exchange": "x", "declareExchange": "true", "declareQueue": "q"}).connection.amqp10


def test_declare_the_exchange_and_the_queue_through_the_management_node(url: str) -> None:
    exchange, queue = f"a10x-{uuid.uuid4().hex[:8]}", f"a10q-{uuid.uuid4().hex[:8]}"
    try:
        options = {
            "exchange": exchange,
            "declareExchange": "true",
            "exchangeType": "topic",
            "declareQueue": queue,
            "bindingKey": "orders.*",
        }
        publish10(url, {"body": [b"a", b"b"], "routing_key": ["orders.new", "refunds.new"]}, mandatory="false", **options)
        # Both were accepted, so the queue holds what it will ever get: the other has no binding (waiting for a second
        # message, as this test once did, only ran out the consumer's 90 s).
        assert ready_count(url, queue) == 1
        got = _consume(url, queue, 1)
        assert [(m.exchange, m.routing_key, b) for m, _, b in got] == [(exchange, "orders.new", b"a")]  # the other: no binding
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_delete(queue)
        conn.channel().exchange_delete(exchange)
        conn.close()


def test_addresses() -> None:
    assert address_of("", "q/1", rabbitmq=True) == "/queues/q%2F1"
    assert address_of("ex", "a b", rabbitmq=True) == "/exchanges/ex/a%20b"
    assert address_of("ex", "", rabbitmq=True) == "/exchanges/ex"
    assert address_of("", "orders", rabbitmq=False) == "orders" and address_of("prices", "k", rabbitmq=False) == "prices"
