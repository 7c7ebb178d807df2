"""What the stream-mode tests share (here and in tests/sink, tests/spark, tests/stream_protocol): streams and
super streams declared and filled over AMQP 0-9-1, options for the protocol a test reads over (the
``read_over`` fixture, tests/streams/conftest.py, sets it), planners, and reading a range or a batch read."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import uuid

import pika
import pyarrow as pa
import pytest
from pyspark.sql.types import StructType

from spark_amqp.errors import AmqpSourceError
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.streams.batch import StreamBatchReader
from spark_amqp.streams.offset import StreamOffset
from spark_amqp.streams.options import StreamSourceOptions, parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange

from ..broker.helpers import wait_for
from ..brokers import EMBEDDED, REAL, STREAM_URLS


def declare_stream(url: str, name: str, **arguments: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream", **arguments})
    conn.close()


def delete_queue(url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(name)
    conn.close()


def publish(url: str, stream: str, first: int, count: int, size: int = 0) -> None:
    """Messages ``m<first>`` ... with bodies ``b<i>`` (padded to ``size``), all confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", stream, f"b{i}".encode().ljust(size, b"."), pika.BasicProperties(message_id=f"m{i}"))
    conn.close()


def publish_compressed(stream_url: str, stream: str, first: int, count: int, codec: str = "zstd") -> None:
    """``count`` messages c<first>... in sub-entries of 100 compressed with ``codec``, as stream clients batch them
    (written by the stream sink), all confirmed."""
    opts = parse_sink_options({"uri": stream_url, "stream": stream, "subEntrySize": "100", "compression": codec})
    table = {"body": [b"c%d" % i for i in range(first, first + count)], "message_id": [f"c{i}" for i in range(first, first + count)]}
    publisher = StreamPartitionPublisher(opts, producer_for("t-" + uuid.uuid4().hex, 0, None))
    assert asyncio.run(publisher.publish([pa.RecordBatch.from_pydict(table)])).confirmed == count


def counted(url: str, stream: str, at_least: int) -> None:
    """Waits until the stream's message count (queue.declare's, which lags a write by up to 5 s) reaches ``at_least``:
    over AMQP, where the stream protocol cannot be asked, a count of 0 is taken for an empty stream."""

    def count() -> int:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            return int(conn.channel().queue_declare(stream, passive=True).method.message_count)
        finally:
            conn.close()

    assert wait_for(lambda: count() >= at_least, timeout=30, interval=0.5), (stream, count())


def next_second() -> int:
    """Waits for the next whole second (epoch), and returns it: stream timestamps are per chunk, to the second."""
    boundary = int(time.time()) + 1
    assert wait_for(lambda: time.time() >= boundary, timeout=5)
    return boundary


# The protocol ``options`` reads over, which the ``read_over`` fixture sets for each run of a test.
READ_OVER = ["amqp"]


def reading_url(url: str) -> str:
    if READ_OVER[0] == "amqp":
        return url
    if READ_OVER[0] == "amqp1.0":
        real = next((b for b in REAL if b.url == url), None)
        if url not in EMBEDDED and (real is None or real.version < (4, 0)):
            pytest.skip("AMQP 1.0 reads streams on RabbitMQ 4.x and the embedded broker (not 3.x)")
        return url
    stream_url = STREAM_URLS.get(url)
    if stream_url is None:
        pytest.skip("this broker's stream protocol port is not known (AMQP_TEST_STREAM_BROKERS)")
    return stream_url


def stream_port(url: str) -> dict[str, str]:
    """Option ``streamPort`` for an amqp:// url: where what RabbitMQ does not deliver over AMQP is checked (the nodes
    here do not all listen on 5552; a read that cannot ask there fails)."""
    port = urllib.parse.urlsplit(STREAM_URLS[url]).port if url in STREAM_URLS else None
    return {"streamPort": str(port)} if port else {}


def options(url: str, stream: str, schema: StructType | None = None, **extra: str) -> StreamSourceOptions:
    """Options to read ``stream`` over the protocol the test runs over; ``schema``: the reader's (some columns)."""
    over = {} if READ_OVER[0] == "stream-protocol" else stream_port(url)
    if READ_OVER[0] == "amqp1.0":
        over["protocol"] = "amqp1.0"
    return parse_stream_options({"uri": reading_url(url), "stream": stream, "connectionTimeout": "20", **over, **extra}, schema)


def offsets_and_ids(opts: StreamSourceOptions, part: StreamRange, batch_rows: int = 10_000) -> list[tuple[int, str]]:
    return [
        (offset, mid)
        for batch in read_range(opts, part, batch_rows)
        for offset, mid in zip(batch.column("offset").to_pylist(), batch.column("message_id").to_pylist(), strict=True)
    ]


def read_all(reader: StreamBatchReader) -> list[tuple[int, str]]:
    """(offset, message id) of every row a batch read gives, partition after partition."""
    rows = []
    for part in reader.partitions():
        for batch in reader.read(part):
            rows += zip(batch.column("offset").to_pylist(), batch.column("message_id").to_pylist(), strict=True)
    return rows


def latest(p: StreamPlanner, start: dict[str, int], expected: dict[str, int], use_minimum: bool = True) -> bool:
    """Whether latestOffset reaches ``expected``, within a few seconds: the planner may reuse an end up to
    0.1 s old (a safe under-estimate), so just-published messages show up on a later call."""
    return wait_for(lambda: p.latest_offset(start, None, use_minimum) == StreamOffset.of(expected), timeout=10, interval=0.02)


def planner(made: list[StreamPlanner], opts: StreamSourceOptions) -> StreamPlanner:
    """A planner the ``planners`` fixture closes after the test."""
    made.append(StreamPlanner(opts))
    return made[-1]


def truncated_stream(url: str, name: str) -> int:
    """A stream whose retention already removed its first messages; returns its first offset."""
    declare_stream(url, name, **{"x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 4_000})
    p = StreamPlanner(options(url, name))
    published = 0
    try:
        while True:
            publish(url, name, published, 100, size=100)
            published += 100
            first = p.client.run(lambda c: p.access.head(c, name), name)
            if first:
                # Retention runs apart from the writer, and can remove another segment after the first: seen in CI, a
                # test's first offset 31 had become 36 when it read. Until the head holds still between two looks.
                while True:
                    time.sleep(0.3)
                    now = p.client.run(lambda c: p.access.head(c, name), name)
                    if now == first:
                        return first
                    first = now
            assert published < 5000, "retention never removed anything"
    finally:
        p.close()


def super_stream(url: str, names, partitions: int, base: str | None = None) -> str:  # type: ignore[no-untyped-def]
    """A super stream as ``rabbitmq-streams add_super_stream`` makes it (its exchange binds partitions
    ``<base>-0`` ... in order), each holding 10, 11, 12 ... messages (ids ``m<100 * partition + i>``)."""
    base = base or names.queue("super")
    names.exchanges.append(base)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.exchange_declare(base, "direct", durable=True, arguments={"x-super-stream": True})
    for i in range(partitions):
        add_partition(ch, names, base, i)
        publish(url, f"{base}-{i}", 100 * i, 10 + i)
    conn.close()
    return base


def add_partition(ch, names, base: str, i: int) -> str:  # type: ignore[no-untyped-def]
    name = f"{base}-{i}"
    names.queues.append(name)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_bind(name, base, str(i), arguments={"x-stream-partition-order": i})
    return name


def raises_within(call, timeout: float) -> str:  # type: ignore[no-untyped-def]
    """The message of the AmqpSourceError ``call`` raises once retried for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call()
        except AmqpSourceError as err:
            return str(err)
        time.sleep(0.05)
    raise AssertionError(f"no error within {timeout}s")
