"""The embedded broker converts a stream's messages between the protocols as RabbitMQ 4.3 does, byte for byte.

Each test sends the same messages to the embedded broker and to the newest real node (the
line the embedded broker models) and compares what comes out: AMQP 0-9-1 publishes read
over the stream protocol (the AMQP 1.0 record RabbitMQ stores), and stream-protocol
publishes read over AMQP 0-9-1 (their properties and headers, or the 541 that closes the
reader's connection where RabbitMQ cannot convert a value). test_rows checks the columns
the connector makes of both on every line; these check the bytes against the modelled one.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker
from spark_amqp_broker.handshake import MODELLED_VERSION

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Symbol, Timestamp
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from tests.brokers import REAL, version_of

from .conftest import STREAM_BROKERS, stream_options
from .helpers import native_messages, publish, until

# Headers in key order: the embedded broker sorts a message's headers when it takes it, RabbitMQ
# keeps the publisher's order in the AMQP 1.0 record (and sorts them for its AMQP 0-9-1 readers).
PIKA_MESSAGES = [
    (b"plain", pika.BasicProperties()),
    (
        b"full",
        pika.BasicProperties(
            content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=3, correlation_id="corr",
            reply_to="rep lies/x", expiration="60000", message_id="urn:uuid:0000ABCD-0000-0000-0000-000000000001",
            timestamp=1_700_000_000, type="kind", user_id="guest", app_id="app",
            headers={"b": True, "big": 2**40, "i": 42, "neg": -5, "none": None, "raw": b"\x01\x02", "s": "str",
                     "ts": datetime.datetime(2024, 1, 2, 3, 4, 5), "x-arr": [1, "a", {"k": "v"}], "x-tab": {"n": 1},
                     "y-nested": {"a": 1}, "z-arr": [1]},
        ),
    ),
    (b"routed", pika.BasicProperties(delivery_mode=1, headers={"CC": ["other"], "x-stream-filter-value": "eu"})),
    (b"typed", pika.BasicProperties(type="amqp-1.0x", expiration="5", priority=0)),
]  # fmt: skip

NATIVE = [
    *native_messages((4, 3)),
    amqp10.encode(b"ids", properties=[uuid.UUID(int=5), None, None, None, "/queues/a%20b", 12345]),
    amqp10.encode(b"binary id", properties=[b"\x01\x02", None, None, None, "/queues/bad%zz", "c" * 300]),
    amqp10.encode(
        b"basic", annotations={Symbol("x-basic-delivery-mode"): 2, Symbol("x-basic-priority"): 4, Symbol("x-basic-expiration"): "99"}
    ),
    amqp10.encode(b"received", annotations={Symbol("x-opt-rabbitmq-received-time"): Timestamp(1_700_000_000_123), Symbol("x-cc"): ["q1"]}),
    amqp10.encode(b"nested", application_properties={"map": {"a": 1}, "neg": -300, "f": 1.5}, header=[False]),
    b"\x00St\xc1\x10\x02\xa1\x01k\xe0\x0a\x02\x71\x00\x00\x00\x01\x00\x00\x00\x02\x00Su\xa0\x01a",  # an array of ints
    b"\x00Su\xa0\x02ab\x00Su\xa0\x01c\x00Sx\xc1\x01\x00",  # two data sections, a footer
    b"\x00Sw\xa1\x05value",  # an amqp-value body: 0-9-1 gets the section, typed amqp-1.0
    b"\x00\xa3\x10amqp:data:binary\xa0\x01a",  # a section named by its symbol
    # RabbitMQ cannot convert these for AMQP 0-9-1 (541):
    amqp10.encode(b"x", application_properties={"u": uuid.UUID(int=1)}),
    amqp10.encode(b"x", annotations={Symbol("x-list"): [1, "a"]}),  # a ulong in a list
    amqp10.encode(b"x", annotations={Symbol("not-x"): "v"}),  # a reserved annotation key
    b"\x00St\xc1\x0a\x02\xa1\x01k\xe0\x04\x02\x54\x01\x02\x00Su\xa0\x01a",  # an array of smallints
    b"\x00Sp\x40\x00Su\xa0\x01z",  # a null header section
    b"\x00Ss\xc0\x03\x01\xa1\x00",  # no body
    b"\x01binary",
]


@pytest.fixture
def pair(shared_embedded: EmbeddedBroker) -> Iterator[list[tuple[str, str]]]:
    """(AMQP 0-9-1 url, stream url) of the embedded broker and of the real node of the line it models."""
    real = [(b.url, STREAM_BROKERS[b.name]) for b in REAL if b.name in STREAM_BROKERS and version_of(b.url) == MODELLED_VERSION]
    if not real:
        pytest.skip(f"no RabbitMQ {MODELLED_VERSION} with the stream protocol in AMQP_TEST_BROKERS / AMQP_TEST_STREAM_BROKERS")
    yield [(shared_embedded.url, shared_embedded.stream_url), real[0]]


def test_an_amqp091_publish_is_read_over_the_stream_protocol_as_rabbitmq_stores_it(pair: list[tuple[str, str]], stream_name: str) -> None:
    seen = [_records(amqp, streams, stream_name) for amqp, streams in pair]
    assert seen[0] == seen[1]


def test_a_stream_protocol_publish_is_read_over_amqp091_as_rabbitmq_converts_it(pair: list[tuple[str, str]], stream_name: str) -> None:
    for i, record in enumerate(NATIVE):
        seen = [_delivery(amqp, streams, f"{stream_name}-{i}", record) for amqp, streams in pair]
        assert seen[0] == seen[1], f"record {i}: {record!r}"


def _records(amqp_url: str, stream_url: str, stream: str) -> list[bytes]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for body, props in PIKA_MESSAGES:
        ch.basic_publish("", stream, body, props)

    async def read() -> list[bytes]:
        client = await StreamClient.connect(stream_options(stream_url), "spark-amqp test conversion")
        got: list[bytes] = []

        def on_chunk(view: memoryview) -> None:
            got.extend(chunks.records(view, chunks.read_header(view)))
            client.credit(1, 1)

        try:
            await client.subscribe(1, stream, OffsetSpec.FIRST, 2, on_chunk)
            await until(lambda: len(got) >= len(PIKA_MESSAGES))
        finally:
            await client.close()
        return got

    try:
        return [r.replace(stream.encode(), b"<stream>") for r in asyncio.run(read())]
    finally:
        ch.queue_delete(stream)
        conn.close()


def _delivery(amqp_url: str, stream_url: str, stream: str, record: bytes) -> Any:
    """What an AMQP 0-9-1 reader gets of ``record``: (exchange, routing key, properties, body), or how its connection closed."""

    async def write(c: StreamClient) -> None:
        await c.create(stream)
        await publish(c, stream, [record])

    async def main() -> None:
        client = await StreamClient.connect(stream_options(stream_url), "spark-amqp test conversion")
        try:
            await write(client)
        finally:
            await client.close()

    asyncio.run(main())
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        for method, props, body in ch.consume(stream, arguments={"x-stream-offset": "first"}, inactivity_timeout=20):
            assert method is not None, "nothing delivered"
            return (
                method.exchange,
                method.routing_key.replace(stream, "<stream>"),
                {k: v for k, v in vars(props).items() if v is not None},
                body,
            )
    except pika.exceptions.ConnectionClosedByBroker as closed:
        return (closed.reply_code, closed.reply_text)
    finally:
        if conn.is_open:
            conn.close()
        cleanup = pika.BlockingConnection(pika.URLParameters(amqp_url))
        cleanup.channel().queue_delete(stream)
        cleanup.close()
