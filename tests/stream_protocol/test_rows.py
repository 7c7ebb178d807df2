"""The same stream read over both protocols gives identical rows (``stream_protocol.rows``).

The AMQP 0-9-1 side is the source's own range reader; the stream-protocol side turns the
records a subscription delivers into rows with the conversion of the broker's version. The
messages come from pika (AMQP 0-9-1) and from the stream protocol (AMQP 1.0, written here),
with the properties and header types each line can convert for an AMQP 0-9-1 reader (the
others close its connection with 541, which is why only the stream protocol reads them).
"""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pika
import pyarrow as pa

from spark_amqp import amqp10
from spark_amqp.reading import arrow
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange
from tests.brokers import version_of

from ..streams.helpers import options
from .conftest import stream_options
from .helpers import native_messages, publish, until

Node = tuple[str, str, str]

PIKA_MESSAGES = [
    (b"plain", pika.BasicProperties()),
    (
        b"full",
        pika.BasicProperties(
            content_type="text/plain",
            content_encoding="gzip",
            delivery_mode=2,
            priority=3,
            correlation_id="corr",
            reply_to="replies",
            expiration="60000",
            message_id="mid",
            timestamp=1_700_000_000,
            type="kind",
            user_id="guest",
            app_id="app",
            headers={"s": "str", "i": 42, "neg": -5, "big": 2**40, "b": True, "ts": datetime.datetime(2024, 1, 2, 3, 4, 5), "raw": b"\x01\x02", "none": None},
        ),
    ),
    (b"transient", pika.BasicProperties(delivery_mode=1, headers={"x-stream-filter-value": "eu"})),
]  # fmt: skip


def test_both_protocols_read_the_same_rows(stream_node: Node, stream_name: str) -> None:
    _, stream_url, amqp_url = stream_node
    version = version_of(amqp_url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(stream_name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for body, props in PIKA_MESSAGES:
        ch.basic_publish("", stream_name, body, props)
    native = native_messages(version)

    async def stream_side() -> tuple[tuple[int, int] | None, list[tuple[int, bytes]]]:
        client = await StreamClient.connect(stream_options(stream_url), "spark-amqp test rows")
        try:
            await publish(client, stream_name, native)
            total = len(PIKA_MESSAGES) + len(native)
            got: list[tuple[int, bytes]] = []

            def on_chunk(view: memoryview) -> None:
                header = chunks.read_header(view)
                got.extend((header.first_offset + i, r) for i, r in enumerate(chunks.records(view, header)))
                client.credit(1, 1)

            await client.subscribe(1, stream_name, OffsetSpec.FIRST, 2, on_chunk)
            await until(lambda: len(got) >= total)
            return client.server_version, got
        finally:
            await client.close()

    try:
        server_version, records = asyncio.run(stream_side())
        conversion = Conversion.of(server_version)
        maker = RowMaker(stream_name, conversion)
        rows = [maker.row(r, o) for o, r in records]
        over_stream = pa.Table.from_batches([arrow.to_stream_batch(rows)])
        end = len(records)
        over_amqp = pa.Table.from_batches(list(read_range(options(amqp_url, stream_name), StreamRange(stream_name, 0, end))))
        assert over_stream.num_rows == over_amqp.num_rows == len(PIKA_MESSAGES) + len(native)
        for name in over_amqp.column_names:
            a, s = over_amqp.column(name).to_pylist(), over_stream.column(name).to_pylist()
            if name == "headers":  # map order is the broker's
                a, s = [None if m is None else sorted(m) for m in a], [None if m is None else sorted(m) for m in s]
            assert s == a, f"column {name}: stream protocol {s} != AMQP 0-9-1 {a}"
    finally:
        ch.queue_delete(stream_name)
        conn.close()


def test_a_record_that_is_not_amqp10_is_its_body_and_nulls() -> None:
    body, stream, exchange, key, offset, props = RowMaker("s", Conversion.of((4, 3))).row(b"\x01binary", 7)
    assert (body, stream, exchange, key, offset, props.arrow_row()) == (b"\x01binary", "s", None, None, 7, (None,) * 14)


def test_an_amqp_value_body_is_its_text() -> None:
    row = RowMaker("s", Conversion.of((4, 3))).row(b"\x00Sw\xa1\x05value", 0)
    assert row[0] == b"value" and row[3] == "s"


def test_a_uuid_header_only_the_stream_protocol_can_read_renders_as_text() -> None:
    record = amqp10.encode(b"x", application_properties={"u": uuid.UUID(int=1)})
    batch = arrow.to_stream_batch([RowMaker("s", Conversion.of((4, 3))).row(record, 0)])
    assert batch.column("headers").to_pylist() == [[("u", "00000000-0000-0000-0000-000000000001")]]


def test_a_body_followed_by_a_footer_and_a_null_section_before_it() -> None:
    """The body is found by the sections' sizes; a footer after it or a null section before it changes nothing."""
    maker = RowMaker("s", Conversion.of((4, 3)))
    footer = b"\x00Sx\xc1\x01\x00"  # an empty footer map
    with_footer = amqp10.encode(b"body", properties=["id-9"]) + footer
    body, _, exchange, key, _, props = maker.row(with_footer, 0)
    assert (body, exchange, key, props.arrow_row()[0]) == (b"body", "", "s", "id-9")
    null_header = b"\x00Sp\x40" + amqp10.encode(b"body", properties=["id-9"])
    body, _, _, _, _, props = maker.row(null_header, 1)
    assert (body, props.arrow_row()[0]) == (b"body", "id-9")
