"""The stream-protocol sink without Spark, on real RabbitMQ 3.10, 4.0 and 4.3: confirms, deduplication,
reconnects, routing, the columns a reader gets back, and the errors a user sees."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pyarrow as pa
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.errors import AmqpOptionError, AmqpPublishError, StreamResponseError
from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import Producer, producer_for
from spark_amqp.sink.publisher import PartitionPublisher, PublishResult
from spark_amqp.sink.routing import partition_of
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.sink.writer import connected
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from tests.brokers import version_of

from ..fake_servers import LateNode
from .stream_helpers import create, delete, drop_after, records, run, until

Node = tuple[str, str, str]


@pytest.fixture
def stream(stream_node: Node, stream_name: str) -> Iterator[str]:
    create(stream_node[1], stream_name)
    yield stream_name
    delete(stream_node[1], stream_name)


def _publish(
    url: str, table: dict[str, list[Any]] | list[dict[str, list[Any]]], producer: Producer | None = None, **options: str
) -> PublishResult:
    opts = parse_sink_options({"uri": url, "connectionTimeout": "20", **options})
    batches = [pa.RecordBatch.from_pydict(t) for t in (table if isinstance(table, list) else [table])]
    return asyncio.run(StreamPartitionPublisher(opts, producer or producer_for("test-" + uuid.uuid4().hex, 0, None)).publish(batches))


def _bodies(url: str, stream: str) -> list[bytes]:
    maker = RowMaker(stream, Conversion.of(None))
    return [maker.row(r, i)[0] for i, r in enumerate(records(url, stream))]


def test_a_partition_is_confirmed_and_read_back_in_order(stream_node: Node, stream: str) -> None:
    n = 2500
    done = _publish(stream_node[1], {"body": [b"m%d" % i for i in range(n)]}, stream=stream, maxInFlight="100")
    assert (done.published, done.confirmed) == (n, n)
    assert _bodies(stream_node[1], stream) == [b"m%d" % i for i in range(n)]


ROW = {
    "body": [b"payload"],
    "message_id": ["id-1"],
    "correlation_id": ["corr-1"],
    "content_type": ["application/json"],
    "content_encoding": ["gzip"],
    "type": ["order.created"],
    "app_id": ["shop"],
    "user_id": ["guest"],
    "reply_to": ["replies"],
    "expiration": ["60000"],
    "priority": [5],
    "timestamp": [datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)],
    "headers": pa.array([[("region", "eu"), ("kind", "a")]], type=pa.map_(pa.string(), pa.string())),
}
INT_HEADERS = {
    "body": [b"n"],
    "headers": pa.array([[("count", 7), ("negative", -3), ("big", 1 << 40)]], type=pa.map_(pa.string(), pa.int64())),
    "delivery_mode": [1],
}


def _consume_091(amqp_url: str, queue: str, n: int) -> list[tuple[Any, Any, bytes]]:
    """What an AMQP 0-9-1 consumer of the stream gets: RabbitMQ's own conversion of the stored message."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[tuple[Any, Any, bytes]] = []
        ch.basic_consume(queue, lambda c, m, p, b: got.append((m, p, b)), arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 30
        while len(got) < n:
            assert time.monotonic() < deadline, f"{len(got)} of {n} messages consumed"
            conn.process_data_events(time_limit=0.1)
        return got
    finally:
        conn.close()


def _seen(method: Any, props: Any, body: bytes) -> dict[str, Any]:
    out = {k: v for k, v in vars(props).items() if v is not None}
    if "headers" in out:
        out["headers"] = {k: v for k, v in out["headers"].items() if k != "x-stream-offset"} or None
    return {**out, "body": body, "exchange": method.exchange}


def test_an_amqp_091_consumer_sees_what_the_amqp_sink_would_have_written(stream_node: Node, stream_name: str) -> None:
    """The same rows through the AMQP sink into one stream and through the stream sink into another:
    RabbitMQ hands an AMQP 0-9-1 consumer the same message from both (its own conversion, each line)."""
    _, url, amqp = stream_node
    via_amqp, via_stream = stream_name + "-amqp", stream_name + "-stream"
    create(url, via_amqp, via_stream)
    try:
        opts = parse_sink_options({"uri": amqp, "routingKey": via_amqp})
        for table in (ROW, INT_HEADERS):
            builder = MessageBuilder(opts)
            batch = pa.RecordBatch.from_pydict(table)
            asyncio.run(PartitionPublisher(opts).publish([builder.messages(batch)], "test", connected(builder)))
            _publish(url, table, stream=via_stream)
        expected = [_seen(*m) for m in _consume_091(amqp, via_amqp, 2)]
        got = [_seen(*m) for m in _consume_091(amqp, via_stream, 2)]
        assert got == expected
    finally:
        delete(url, via_amqp, via_stream)


def test_the_source_reads_the_columns_back_as_written(stream_node: Node, stream: str) -> None:
    _, url, amqp = stream_node
    table = {**ROW, "routing_key": ["orders.eu"], "exchange": ["shop"], "filter_value": ["eu"]}
    _publish(url, table, stream=stream)
    [record] = records(url, stream)
    body, queue, exchange, key, _offset, properties = RowMaker(stream, Conversion.of(version_of(amqp))).row(record, 0)
    assert (body, queue, exchange, key) == (b"payload", stream, "shop", "orders.eu")
    columns = dict(
        zip(
            (
                "message_id",
                "correlation_id",
                "content_type",
                "content_encoding",
                "type",
                "app_id",
                "user_id",
                "reply_to",
                "expiration",
                "priority",
                "delivery_mode",
                "timestamp",
                "headers",
            ),
            properties.columns,
            strict=False,
        )
    )
    assert columns == {
        "message_id": "id-1",
        "correlation_id": "corr-1",
        "content_type": "application/json",
        "content_encoding": "gzip",
        "type": "order.created",
        "app_id": "shop",
        "user_id": "guest",
        "reply_to": "replies",
        "expiration": "60000",
        "priority": 5,
        "delivery_mode": 2,
        "timestamp": 1714979289,
        "headers": {"region": "eu", "kind": "a", "x-stream-filter-value": "eu"},
    }


# -- deduplication -------------------------------------------------------------------------------------------


def test_a_retried_partition_is_stored_once(stream_node: Node, stream: str) -> None:
    producer = producer_for("query-1", 3, 7)
    table = {"body": [b"r%d" % i for i in range(500)]}
    for _ in range(2):  # the task, then its retry
        done = _publish(stream_node[1], table, producer, stream=stream)
        assert (done.published, done.confirmed) == (500, 500)
    assert _bodies(stream_node[1], stream) == table["body"]
    assert run(stream_node[1], lambda c: c.publisher_sequence("query-1-3", stream)) == (7 << 32) + 499


def test_without_deduplication_a_retry_stores_the_partition_twice(stream_node: Node, stream: str) -> None:
    table = {"body": [b"r%d" % i for i in range(100)]}
    for _ in range(2):
        _publish(stream_node[1], table, producer_for("query-1", 3, 7, deduplication=False), stream=stream, deduplication="false")
    assert _bodies(stream_node[1], stream) == table["body"] * 2


def test_the_next_batch_is_stored_after_a_replayed_one(stream_node: Node, stream: str) -> None:
    url = stream_node[1]
    _publish(url, {"body": [b"a", b"b", b"c"]}, producer_for("q", 0, 4), stream=stream)
    _publish(url, {"body": [b"a", b"b", b"c"]}, producer_for("q", 0, 4), stream=stream)  # batch 4 replayed
    _publish(url, {"body": [b"d"]}, producer_for("q", 0, 5), stream=stream)  # batch 5: its first row has a higher id
    assert _bodies(url, stream) == [b"a", b"b", b"c", b"d"]


def test_a_dropped_connection_is_reconnected_and_every_row_stored_once(
    stream_node: Node, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spark_amqp.transport.backoff.FIRST", 0.01)
    dropped = drop_after(monkeypatch, 1000, times=2)
    n = 5000
    done = _publish(
        stream_node[1], [{"body": [b"m%d" % i for i in range(k, k + 500)]} for k in range(0, n, 500)], stream=stream, maxInFlight="400"
    )
    assert len(dropped) == 2 and (done.published, done.confirmed) == (n, n)
    assert _bodies(stream_node[1], stream) == [b"m%d" % i for i in range(n)]


def test_a_task_failed_mid_partition_and_retried_stores_every_row_once(
    stream_node: Node, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StreamPartitionPublisher, "_may_retry", lambda *_: False)  # no reconnect in the task: it fails, Spark retries it
    producer = producer_for("query-2", 1, 0)
    table = [{"body": [b"m%d" % i for i in range(k, k + 500)]} for k in range(0, 3000, 500)]
    with monkeypatch.context() as patch:
        drop_after(patch, 1200)
        with pytest.raises(AmqpPublishError, match=rf"messages published to stream '{stream}' .* are not confirmed .*socket closed"):
            _publish(stream_node[1], table, producer, stream=stream, maxInFlight="300")
    assert 1200 <= len(_bodies(stream_node[1], stream)) < 3000
    _publish(stream_node[1], table, producer, stream=stream)  # the retry
    assert _bodies(stream_node[1], stream) == [b"m%d" % i for i in range(3000)]


def test_without_deduplication_a_dropped_connection_fails_the_task(stream_node: Node, stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drop_after(monkeypatch, 300)
    with pytest.raises(AmqpPublishError, match="the task fails so that Spark retries it"):
        _publish(
            stream_node[1],
            {"body": [b"m"] * 2000},
            producer_for("q", 0, 0, deduplication=False),
            stream=stream,
            deduplication="false",
            maxInFlight="100",
        )


# -- a failover before the first message: waited out, never published twice -------------------------------------


@pytest.mark.parametrize("deduplication", ["true", "false"])
def test_a_leader_election_before_the_first_message_is_waited_out(embedded: EmbeddedBroker, deduplication: str) -> None:
    """CI's failover test once died here: RabbitMQ answered declare_publisher with 0x06 while it elected the
    stream's new leader, and the task failed at once, three times within a second. Nothing was published
    yet, so trying again is safe with deduplication off too."""
    name = f"sp-{uuid.uuid4().hex[:10]}"
    create(embedded.stream_url, name)
    embedded.refuse_stream_publishers(4)
    started = time.monotonic()
    producer = producer_for("q", 0, 0, deduplication=deduplication == "true")
    done = _publish(embedded.stream_url, {"body": [b"m%d" % i for i in range(300)]}, producer, stream=name, deduplication=deduplication)
    assert (done.published, done.confirmed) == (300, 300)
    assert _bodies(embedded.stream_url, name) == [b"m%d" % i for i in range(300)]
    assert time.monotonic() - started >= 0.2 + 0.4 + 0.8 + 1.6  # four refusals, backed off


def test_a_stream_that_stays_unavailable_fails_after_broker_outage_timeout(embedded: EmbeddedBroker) -> None:
    name = f"sp-{uuid.uuid4().hex[:10]}"
    create(embedded.stream_url, name)
    embedded.refuse_stream_publishers(1000)
    started = time.monotonic()
    with pytest.raises(AmqpPublishError) as caught:
        _publish(embedded.stream_url, {"body": [b"x"]}, stream=name, brokerOutageTimeout="2s")
    took = time.monotonic() - started
    text = str(caught.value)
    assert f"stream '{name}'" in text and "stream not available (0x06)" in text and "brokerOutageTimeout=2s" in text, text
    assert "nothing was published" in text and "Spark retries it" in text and "guest:" not in text, text
    assert 1.0 <= took < 10, took  # the backoff's next delay would pass 2 s: it gives up before it
    embedded.refuse_stream_publishers(0)  # reading back publishes a marker
    assert _bodies(embedded.stream_url, name) == []


def test_a_broker_refusing_connections_for_a_while_is_waited_out(embedded: EmbeddedBroker) -> None:
    name = f"sp-{uuid.uuid4().hex[:10]}"
    create(embedded.stream_url, name)
    embedded.refuse_connections(1.5)
    done = _publish(
        embedded.stream_url, {"body": [b"a", b"b"]}, producer_for("q", 0, 0, deduplication=False), stream=name, deduplication="false"
    )
    assert (done.published, done.confirmed) == (2, 2) and _bodies(embedded.stream_url, name) == [b"a", b"b"]


def test_a_node_that_comes_back_before_the_first_message_is_waited_out(stream_node: Node, stream: str) -> None:
    """The same on every broker: the sink reaches it through a node that closes every connection for 1.5 s
    (nothing published yet: retried with deduplication off too)."""
    url = stream_node[1]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    node = LateNode(port, down=1.5)
    try:
        late_url = url.replace(f":{port}/", f":{node.port}/")
        done = _publish(
            late_url, {"body": [b"a", b"b"]}, producer_for("q", 0, 0, deduplication=False), stream=stream, deduplication="false"
        )
    finally:
        node.close()
    assert node.refused >= 2 and (done.published, done.confirmed) == (2, 2)
    assert _bodies(url, stream) == [b"a", b"b"]


def test_own_publishing_ids_deduplicate_and_must_increase(stream_node: Node, stream: str) -> None:
    url = stream_node[1]
    producer = producer_for("own", 0, None)
    _publish(url, {"body": [b"a", b"b"], "publishing_id": [10, 20]}, producer, stream=stream)
    _publish(url, {"body": [b"a", b"b", b"c"], "publishing_id": [10, 20, 30]}, producer, stream=stream)
    assert _bodies(url, stream) == [b"a", b"b", b"c"]
    with pytest.raises(AmqpOptionError, match=r"column 'publishing_id', row 2 of this partition \(int 40\): publishing ids must increase"):
        _publish(url, {"body": [b"x", b"y", b"z"], "publishing_id": [50, 60, 40]}, producer, stream=stream)
    assert _bodies(url, stream) == [b"a", b"b", b"c"]  # nothing of the bad batch went out


# -- super streams --------------------------------------------------------------------------------------------


def test_super_stream_rows_go_to_the_partitions_their_keys_pick(stream_node: Node, stream_name: str) -> None:
    url = stream_node[1]
    partitions = [f"{stream_name}-{i}" for i in range(3)]
    create(url, *partitions)
    try:
        keys = [f"customer-{i}" for i in range(60)] + ["customer-" + "x" * 300]  # a key is only hashed: no 255-byte limit
        done = _publish(url, {"body": [k.encode() for k in keys], "partition_key": keys}, superStream=stream_name)
        assert done.confirmed == 61
        for i, partition in enumerate(partitions):
            assert _bodies(url, partition) == [k.encode() for k in keys if partition_of(k, 3) == i]
    finally:
        delete(url, *partitions)


def test_a_missing_super_stream_fails_saying_so(stream_node: Node, stream_name: str) -> None:
    with pytest.raises(
        AmqpPublishError, match=rf"super stream '{stream_name}' .*no partition stream '{stream_name}-0' found.*nothing was published"
    ):
        _publish(stream_node[1], {"body": [b"x"], "partition_key": ["k"]}, superStream=stream_name)


# -- failures a user sees ----------------------------------------------------------------------------------------


def test_a_missing_stream_fails_at_once_naming_it_and_the_code(stream_node: Node, stream_name: str) -> None:
    started = time.monotonic()
    with pytest.raises(AmqpPublishError) as caught:
        _publish(stream_node[1], {"body": [b"x"]}, stream=stream_name)
    text = str(caught.value)
    assert f"stream '{stream_name}'" in text and "stream does not exist (0x02)" in text
    assert "nothing was published" in text and "this is not transient" in text and "guest:" not in text
    assert time.monotonic() - started < 10  # no retry loop


def test_a_message_larger_than_a_frame_fails_naming_the_row(stream_node: Node, stream: str) -> None:
    with pytest.raises(AmqpOptionError, match=r"column 'body', row 1 of this partition.*more than a stream protocol frame holds"):
        _publish(stream_node[1], {"body": [b"small", b"x" * 2_000_000]}, stream=stream)
    assert _bodies(stream_node[1], stream) == []


def test_a_stream_deleted_under_the_publisher_fails_the_task(stream_node: Node, stream_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = stream_node[1]
    create(url, stream_name)
    original = StreamPartitionPublisher._on_confirm
    deleted: list[bool] = []

    def on_confirm(self: StreamPartitionPublisher, target: int, ids: list[int]) -> None:
        original(self, target, ids)
        if not deleted:
            deleted.append(True)
            asyncio.get_running_loop().create_task(self._client.delete(stream_name))  # type: ignore[union-attr]

    monkeypatch.setattr(StreamPartitionPublisher, "_on_confirm", on_confirm)
    with pytest.raises(AmqpPublishError, match=rf"stream '{stream_name}'.*(stream does not exist|not confirmed)"):
        _publish(url, [{"body": [b"m"] * 200} for _ in range(20)], stream=stream_name, maxInFlight="50")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({}, "needs option 'stream' (the stream to write to) or 'superStream'"),
        ({"stream": "a", "superStream": "b"}, "options 'stream' and 'superStream' exclude each other"),
        ({"stream": " "}, "option 'stream' is empty"),
        ({"stream": "a", "exchange": "x"}, "option 'exchange' does not apply to a rabbitmq-stream:// uri"),
        ({"stream": "a", "declareQueue": "q"}, "option 'declareQueue' does not apply to a rabbitmq-stream:// uri"),
        ({"stream": "a", "mandatory": "false"}, "option 'mandatory' does not apply"),
        ({"stream": "a", "deduplication": "maybe"}, "option 'deduplication' must be true or false"),
    ],
)
def test_bad_stream_sink_options_name_the_option(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(AmqpOptionError) as caught:
        parse_sink_options({"uri": "rabbitmq-stream://alice:s3cret-pw@host/", **options})
    assert fragment in str(caught.value) and "s3cret-pw" not in str(caught.value)


@pytest.mark.parametrize("key", ["stream", "deduplication"])
def test_stream_protocol_options_need_a_stream_uri(key: str) -> None:
    with pytest.raises(AmqpOptionError, match=rf"option '{key}' needs a rabbitmq-stream:// uri"):
        parse_sink_options({"uri": "amqp://h/", key: "true"})


def test_stream_sink_options_parse() -> None:
    opts = parse_sink_options({"uri": "rabbitmq-stream://u@h/v", "password": "pw", "stream": " events ", "deduplication": "false"})
    assert (opts.stream, opts.deduplication, opts.connection.stream_protocol, opts.connection.display_uri) == (
        "events",
        False,
        True,
        "rabbitmq-stream://u@h:5552/v",
    )
    assert parse_sink_options({"uri": "rabbitmq-stream://u@h/v", "superStream": "orders"}).deduplication is True


# -- the client's publish v2 (filter values) ----------------------------------------------------------------------


def test_publish_v2_carries_filter_values_a_filtered_subscription_uses(stream_node: Node, stream: str) -> None:
    if version_of(stream_node[2]) < (3, 13):
        pytest.skip("publish v2 and stream filtering are RabbitMQ 3.13+")

    async def body(c: StreamClient) -> list[bytes]:
        confirmed: list[int] = []
        await c.declare_publisher(1, "", stream, confirmed.extend, lambda errors: None)
        c.publish_filtered(1, [(1, "eu", b"eu-1"), (2, "eu", b"eu-2")])
        await until(lambda: len(confirmed) == 2)
        c.publish_filtered(1, [(3, "us", b"us-1"), (4, None, b"none-1")])
        await until(lambda: len(confirmed) == 4)
        c.publish(1, [(5, b"eu-3-unfiltered")])
        await until(lambda: len(confirmed) == 5)
        got: list[bytes] = []

        def on_chunk(view: memoryview) -> None:
            got.extend(chunks.records(view, chunks.read_header(view)))
            c.credit(7, 1)

        await c.subscribe(7, stream, OffsetSpec.FIRST, 1, on_chunk, {"filter.0": "eu", "match-unfiltered": "false"})
        # The broker skips chunks whose Bloom filter cannot hold "eu": the marker's chunk has no filter value.
        await until(lambda: b"eu-2" in got)
        return got

    assert run(stream_node[1], body) == [b"eu-1", b"eu-2"]


def test_filter_values_reach_the_chunk_filter_through_the_sink(stream_node: Node, stream: str) -> None:
    if version_of(stream_node[2]) < (3, 13):
        pytest.skip("stream filtering is RabbitMQ 3.13+")
    url = stream_node[1]
    _publish(url, {"body": [b"eu-1", b"eu-2"], "filter_value": ["eu", "eu"]}, stream=stream)
    _publish(url, {"body": [b"us-1"], "filter_value": ["us"]}, stream=stream)

    async def body(c: StreamClient) -> list[bytes]:
        got: list[bytes] = []

        def on_chunk(view: memoryview) -> None:
            got.extend(chunks.records(view, chunks.read_header(view)))
            c.credit(7, 1)

        await c.subscribe(7, stream, OffsetSpec.FIRST, 1, on_chunk, {"filter.0": "us"})
        await until(lambda: len(got) >= 1)
        return got

    records_ = run(url, body)
    assert [RowMaker(stream, Conversion.of(None)).row(r, 0)[0] for r in records_] == [b"us-1"]


def test_older_brokers_get_publish_v1_and_the_value_in_the_message(stream_node: Node, stream: str) -> None:
    _, url, amqp = stream_node
    _publish(url, {"body": [b"eu-1"], "filter_value": ["eu"]}, stream=stream)
    [record] = records(url, stream)
    headers = RowMaker(stream, Conversion.of(version_of(amqp))).row(record, 0)[5].columns[12]
    assert headers == {"x-stream-filter-value": "eu"}


def test_stream_response_errors_keep_their_code() -> None:
    err = StreamResponseError(0x06, "publishing")
    assert err.transient and "stream not available (0x06)" in str(err)


def test_the_broker_forgets_the_least_recently_used_names_past_255_when_a_segment_starts(stream_node: Node, stream_name: str) -> None:
    """What docs/sink.md says of the producer-name limit (osiris_tracking's max_sequences, 255): nothing is refused;
    when the stream starts a new segment file, only the 255 most recently used names are kept, and a name the
    broker forgot is deduplicated no more."""
    if stream_node[0] == "embedded":
        pytest.skip("the embedded broker keeps every producer name: it has no segment files to start")
    url = stream_node[1]
    create(url, stream_name, **{"stream-max-segment-size-bytes": "100000"})

    async def body(c: StreamClient) -> tuple[list[int], int]:
        async def one(reference: str, publishing_id: int, message: bytes) -> None:
            confirmed: list[int] = []
            await c.declare_publisher(1, reference, stream_name, confirmed.extend, lambda errors: None)
            c.publish(1, [(publishing_id, message)])
            await until(lambda: bool(confirmed))
            await c.delete_publisher(1)

        for i in range(300):
            await one(f"w{i}", 7, b"x")
        for _ in range(20):  # 200 kB: past the segment size, so a new segment (and a tracking snapshot) starts
            await one("", 1, b"y" * 10_000)
        kept = [await c.publisher_sequence(f"w{i}", stream_name) for i in range(300)]
        await one("w0", 7, b"again")  # forgotten: stored again
        return kept, await c.publisher_sequence("w0", stream_name)

    try:
        kept, again = run(url, body)
        assert kept == [0] * 45 + [7] * 255 and again == 7
        assert records(url, stream_name)[-1] == b"again"
    finally:
        delete(url, stream_name)


def test_the_publishing_id_column_is_checked_on_the_driver() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark_amqp.sink.columns import check_schema

    schema = StructType([StructField("body", StringType()), StructField("publishing_id", LongType())])
    check_schema(schema, parse_sink_options({"uri": "rabbitmq-stream://h/", "stream": "s"}))
    with pytest.raises(AmqpOptionError, match=r"unknown column\(s\) publishing_id"):
        check_schema(schema, parse_sink_options({"uri": "amqp://h/"}))
    with pytest.raises(
        AmqpOptionError, match="column 'publishing_id' sets the ids the broker deduplicates by: it needs deduplication=true"
    ):
        check_schema(schema, parse_sink_options({"uri": "rabbitmq-stream://h/", "stream": "s", "deduplication": "false"}))
    text = StructType([StructField("body", StringType()), StructField("publishing_id", StringType())])
    with pytest.raises(AmqpOptionError, match="column 'publishing_id' must be an integer, not string"):
        check_schema(text, parse_sink_options({"uri": "rabbitmq-stream://h/", "stream": "s"}))
