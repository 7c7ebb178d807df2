"""The sink's publisher without Spark: confirms, nacks, returns, timeouts, lost connections."""

from __future__ import annotations

import asyncio
import threading

import pyarrow as pa
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.errors import AmqpOptionError, AmqpPublishError
from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.publisher import PartitionPublisher

from ..broker.helpers import connect, drain, ready_count
from ..fake_servers import LateNode
from .helpers import both_nodes, publish_table


def _declare(url: str, queue: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
    conn = connect(url)
    conn.channel().queue_declare(queue, **kwargs)
    conn.close()


def test_every_message_confirmed_and_delivered_with_properties(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _declare(amqp_url, q)
    n = 2500
    result = publish_table(
        amqp_url,
        {
            "body": [b"m%d" % i for i in range(n)],
            "message_id": [f"id{i}" for i in range(n)],
            "priority": [i % 10 for i in range(n)],
            "headers": [[("k", str(i))] for i in range(n)],
            "type": ["t"] * n,
        },
        routingKey=q,
        maxInFlight="100",
    )
    assert (result.published, result.confirmed) == (n, n)
    got = drain(connect(amqp_url).channel(), q, limit=n + 1)
    assert len(got) == n
    _, props, body = got[7]
    assert body == b"m7" and props.message_id == "id7" and props.priority == 7 and props.headers == {"k": "7"}
    assert props.type == "t" and props.delivery_mode == 2  # persistent by default


def test_reject_publish_queue_nacks_fail_the_partition(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _declare(amqp_url, q, arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    with pytest.raises(AmqpPublishError, match=r"nacked by the broker") as info:
        publish_table(amqp_url, {"body": [b"x"] * 50}, routingKey=q)
    assert f"routing key '{q}'" in str(info.value) and "of 50 messages" in str(info.value)
    assert drain(connect(amqp_url).channel(), q, limit=100).__len__() == 10  # the confirmed ones are there


def test_unroutable_with_mandatory_fails_without_mandatory_is_dropped(amqp_url: str) -> None:
    with pytest.raises(AmqpPublishError, match=r"1 returned as unroutable \(312 NO_ROUTE"):
        publish_table(amqp_url, {"body": [b"x"]}, exchange="amq.direct", routingKey="test.nobody.listens")
    result = publish_table(amqp_url, {"body": [b"x"]}, exchange="amq.direct", routingKey="test.nobody.listens", mandatory="false")
    assert (result.published, result.confirmed) == (1, 1)


def test_missing_exchange_closes_the_channel_and_fails_as_not_transient(amqp_url: str) -> None:
    with pytest.raises(AmqpPublishError, match=r"404 NOT_FOUND") as info:
        publish_table(amqp_url, {"body": [b"x"] * 5}, exchange="test.no.such.exchange", routingKey="k")
    assert "this is not transient" in str(info.value) and "Spark retries it" not in str(info.value)


def test_wrong_password_and_missing_vhost_fail_at_once_and_say_so(amqp_url: str) -> None:
    import time

    began = time.monotonic()
    with pytest.raises(AmqpPublishError) as info:
        publish_table(amqp_url.replace("guest:guest@", "guest:not-the-password@"), {"body": [b"x"]}, connectionTimeout="30")
    assert "refused the login of user 'guest'" in str(info.value) and "not-the-password" not in str(info.value)
    with pytest.raises(AmqpPublishError, match=r"vhost 'nope' does not exist .*530 NOT_ALLOWED.*not transient"):
        publish_table(amqp_url.replace("/%2F", "/nope"), {"body": [b"x"]}, connectionTimeout="30")
    assert time.monotonic() - began < 10


def test_a_broker_refusing_connections_for_a_while_is_waited_out_before_the_first_message(embedded: EmbeddedBroker) -> None:
    # A node restarting under a one-node uri (or every node at once): failing at once would spend Spark's
    # task attempts within a second; nothing is published yet, so trying again publishes nothing twice.
    _declare(embedded.url, "q")
    embedded.refuse_connections(1.5)
    result = publish_table(embedded.url, {"body": [b"m%d" % i for i in range(20)]}, routingKey="q", connectionTimeout="2")
    assert (result.published, result.confirmed) == (20, 20)
    conn = connect(embedded.url)
    assert [body for _, _, body in drain(conn.channel(), "q")] == [b"m%d" % i for i in range(20)]
    conn.close()


def test_a_node_that_comes_back_before_the_first_message_is_waited_out(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    """The same on every broker: the sink reaches it through a node that closes every connection for 1.5 s."""
    q = names.queue()
    _declare(amqp_url, q)
    port = int(amqp_url.rsplit(":", 1)[1].split("/")[0])
    node = LateNode(port, down=1.5)
    try:
        late_url = amqp_url.replace(f":{port}/", f":{node.port}/")
        result = publish_table(late_url, {"body": [b"m%d" % i for i in range(20)]}, routingKey=q, connectionTimeout="5")
    finally:
        node.close()
    assert node.refused >= 2 and (result.published, result.confirmed) == (20, 20)
    conn = connect(amqp_url)
    assert [body for _, _, body in drain(conn.channel(), q)] == [b"m%d" % i for i in range(20)]
    conn.close()


def test_a_broker_gone_for_broker_outage_timeout_fails_naming_it(embedded: EmbeddedBroker) -> None:
    import time

    embedded.refuse_connections(3600)
    began = time.monotonic()
    with pytest.raises(AmqpPublishError) as info:
        publish_table(embedded.url, {"body": [b"x"]}, routingKey="q", brokerOutageTimeout="2s", connectionTimeout="2")
    took = time.monotonic() - began
    text = str(info.value)
    assert "brokerOutageTimeout=2s" in text and "nothing was published" in text and "guest:" not in text, text
    assert 1.0 <= took < 15, took


def test_inequivalent_declare_queue_is_refused_before_publishing(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _declare(amqp_url, q, durable=False)
    with pytest.raises(AmqpPublishError, match=rf"queue '{q}'.*406 PRECONDITION_FAILED.*not transient"):
        publish_table(amqp_url, {"body": [b"x"]}, routingKey=q, declareQueue=q)


def test_injected_nacks(embedded: EmbeddedBroker) -> None:
    _declare(embedded.url, "q")
    embedded.nack_next_publishes(3)
    with pytest.raises(AmqpPublishError, match=r"3 nacked by the broker .* of 20 messages"):
        publish_table(embedded.url, {"body": [b"x"] * 20}, routingKey="q")


def test_confirm_timeout(embedded: EmbeddedBroker) -> None:
    # No confirm for confirmTimeout: connected again (the only node) and the 5 published again, until
    # brokerOutageTimeout has passed since the first timeout.
    _declare(embedded.url, "q")
    embedded.hold_confirms()
    try:
        with pytest.raises(
            AmqpPublishError,
            match=r"5 of 5 messages .* got no confirm within confirmTimeout=0.5s \(still, after [2-9] attempt\(s\) over [0-9]+s: "
            r"brokerOutageTimeout=2s\); the task fails so that Spark retries it",
        ):
            publish_table(embedded.url, {"body": [b"x"] * 5}, routingKey="q", confirmTimeout="0.5", brokerOutageTimeout="2s")
    finally:
        embedded.release_confirms()


def test_a_blocked_connection_publishes_nothing_and_fails_saying_why(embedded: EmbeddedBroker) -> None:
    # A memory or disk alarm: RabbitMQ sends connection.blocked and stops reading from publishers.
    _declare(embedded.url, "q")
    embedded.raise_alarm("low on disk")
    try:
        with pytest.raises(AmqpPublishError, match=r"the broker blocked publishing \(memory or disk alarm: low on disk\)"):
            publish_table(embedded.url, {"body": [b"x"] * 50}, routingKey="q", confirmTimeout="1")
    finally:
        embedded.clear_alarm()
    assert embedded.queue_stats("q")["ready"] == 0  # nothing was written while blocked


def test_publishing_goes_on_once_the_broker_unblocks(embedded: EmbeddedBroker) -> None:
    _declare(embedded.url, "q")
    embedded.raise_alarm("low on memory")
    threading.Timer(0.5, embedded.clear_alarm).start()
    result = publish_table(embedded.url, {"body": [b"x"] * 50}, routingKey="q", confirmTimeout="10")
    assert result.confirmed == 50 and embedded.queue_stats("q")["ready"] == 50


def test_a_connection_dropped_mid_publish_is_replaced_and_its_unconfirmed_messages_published_again(embedded: EmbeddedBroker) -> None:
    _declare(embedded.url, "q")
    embedded.hold_confirms()
    dropped = threading.Event()

    def drop() -> None:
        assert embedded.drop_connections(name_contains="spark-amqp sink") == 1
        embedded.release_confirms()
        dropped.set()

    threading.Timer(0.3, drop).start()
    bodies = [b"m%d" % i for i in range(50)]
    result = publish_table(embedded.url, {"body": bodies}, routingKey="q", maxInFlight="10")
    assert dropped.is_set() and (result.published, result.confirmed) == (50, 50)
    conn = connect(embedded.url)
    got = [body for _, _, body in drain(conn.channel(), "q")]
    conn.close()
    # Every message, and again at most the 10 the dropped connection had not confirmed.
    assert set(got) == set(bodies) and 50 < len(got) <= 60, got


def test_a_node_that_stops_confirming_is_left_for_another_of_the_uri(embedded: EmbeddedBroker, listed: None) -> None:
    # A node cut off from its cluster keeps taking messages it cannot confirm: after confirmTimeout the
    # publisher connects again, to the uri's other node first, and publishes there what was not confirmed.
    with EmbeddedBroker() as other:
        for url in (embedded.url, other.url):
            _declare(url, "q")
        embedded.hold_confirms()
        bodies = [b"m%d" % i for i in range(40)]
        result = publish_table(
            both_nodes(embedded, other), {"body": bodies}, routingKey="q", maxInFlight="10", confirmTimeout="0.5", brokerOutageTimeout="10s"
        )
        embedded.release_confirms()
        assert (result.published, result.confirmed) == (40, 40)
        conn = connect(other.url)
        assert [body for _, _, body in drain(conn.channel(), "q")] == bodies  # all 10 unconfirmed, then the rest
        conn.close()
        assert embedded.queue_stats("q")["ready"] == 10  # what the node took but never confirmed: at least once


def test_window_limits_outstanding_confirms(embedded: EmbeddedBroker) -> None:
    _declare(embedded.url, "q")
    embedded.hold_confirms(0.5)
    result = publish_table(embedded.url, {"body": [b"x"] * 30}, routingKey="q", maxInFlight="7", confirmTimeout="5")
    assert result.confirmed == 30
    assert embedded.queue_stats("q")["ready"] == 30


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"body": [b"ok", None]}, "column 'body', row 1 of this partition (null): every message needs a body"),
        ({"body": [b"x"], "routing_key": ["k" * 256]}, "column 'routing_key', row 0 of this partition (str 'kkk"),
        ({"body": [b"x" * 11]}, "column 'body', row 0 of this partition (bytes): 11 bytes is larger than the broker accepts"),
        ({"body": [b"x", b"y"], "delivery_mode": [2, 7]}, "column 'delivery_mode', row 1 of this partition (int 7): must be 1"),
        ({"body": [b"x"], "priority": [300]}, "column 'priority', row 0 of this partition (int 300): must be between 0 and 255"),
        ({"body": [b"x"], "message_id": ["m" * 256]}, "column 'message_id', row 0 of this partition (str"),
        ({"body": [b"x"], "expiration": ["1 hour"]}, "column 'expiration', row 0 of this partition (str '1 hour'): must be a whole number"),
        ({"body": [b"x"], "timestamp": [-5]}, "column 'timestamp', row 0 of this partition (int -5): must be between 1970-01-01"),
        ({"body": [b"x"], "headers": [[("k" * 300, "v")]]}, "column 'headers', row 0 of this partition (list"),
    ],
)
def test_bad_values_fail_before_publishing_the_batch(embedded: EmbeddedBroker, table: dict, fragment: str) -> None:  # type: ignore[type-arg]
    _declare(embedded.url, "q")
    with pytest.raises(AmqpOptionError) as info:
        publish_table(embedded.url, table, routingKey="q", maxMessageSize="10")
    assert fragment in str(info.value)
    assert embedded.queue_stats("q")["ready"] == 0


def test_a_body_over_the_brokers_default_max_message_size_fails_before_it_is_published(amqp_url: str, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    # RabbitMQ 4.0 lowered its default max_message_size from 128 MiB to 16 MiB (a larger body
    # closes the channel with 406). Without option maxMessageSize, the sink holds bodies to the
    # default of the broker's line, checked before the batch's first message goes out.
    q = names.queue()
    _declare(amqp_url, q)
    table = {"body": [b"small", b"x" * (16 * 1024 * 1024 + 1)]}
    if broker_version >= (4, 0):
        with pytest.raises(AmqpOptionError) as info:
            publish_table(amqp_url, table, routingKey=q)
        assert "row 1 of this partition" in str(info.value) and "default max_message_size, 16777216" in str(info.value)
        assert ready_count(amqp_url, q) == 0
    else:
        assert publish_table(amqp_url, table, routingKey=q).confirmed == 2
    with pytest.raises(AmqpOptionError, match=r"maxMessageSize 6\)"):  # the option, when given, is the limit everywhere
        publish_table(amqp_url, {"body": [b"x" * 7]}, routingKey=q, maxMessageSize="6")


def test_a_bad_value_in_a_later_batch_names_its_row_in_the_partition(embedded: EmbeddedBroker) -> None:
    _declare(embedded.url, "q")
    opts = parse_sink_options({"uri": embedded.url, "routingKey": "q"})
    builder = MessageBuilder(opts)
    first = pa.RecordBatch.from_pydict({"body": [b"a", b"b", b"c"], "priority": [1, 2, 3]})
    second = pa.RecordBatch.from_pydict({"body": [b"d", b"e", b"f"], "priority": [4, 5, 999]})
    with pytest.raises(AmqpOptionError) as info:
        asyncio.run(PartitionPublisher(opts).publish([builder.messages(first), builder.messages(second)], "test"))
    message = str(info.value)
    assert "column 'priority', row 5 of this partition (int 999)" in message
    assert "nothing of its batch was published, the 3 row(s) before that batch were" in message
    assert embedded.queue_stats("q")["ready"] == 3  # the first batch, confirmed; none of the second


def test_sink_option_errors() -> None:
    with pytest.raises(AmqpOptionError, match="unknown option 'routing_key'"):
        parse_sink_options({"uri": "amqp://h/", "routing_key": "k"})
    with pytest.raises(AmqpOptionError, match="'maxInFlight' must be between 1"):
        parse_sink_options({"uri": "amqp://h/", "maxInFlight": "0"})
    with pytest.raises(AmqpOptionError, match="'routingKey' is longer than 255 bytes"):
        parse_sink_options({"uri": "amqp://h/", "routingKey": "k" * 300})
    with pytest.raises(AmqpOptionError, match="'declareExchange' needs option 'exchange'"):
        parse_sink_options({"uri": "amqp://h/", "declareExchange": "true"})
