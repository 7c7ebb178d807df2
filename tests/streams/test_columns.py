"""Reading some of a stream's columns (``.schema(...)``), over every protocol and on both of the stream protocol's paths
(the compiled core, and pure Python: ``read_over``'s stream-protocol-python): each batch holds exactly the columns asked
for, in the declared order and spelling, with the values a read of every column has; a read of body and offset decodes
no message's properties, so one whose properties cannot be decoded still reads."""

from __future__ import annotations

from typing import Any

import pika
import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType

from spark_amqp import amqp10
from spark_amqp.client import properties
from spark_amqp.errors import AmqpSourceError
from spark_amqp.stream_protocol import core, rows
from spark_amqp.streams import held
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange

from ..stream_protocol.helpers import publish as publish_records
from ..stream_protocol.helpers import run
from .helpers import declare_stream, options, reading_url

pytestmark = pytest.mark.usefixtures("read_over")

N = 30
HEADERS = MapType(StringType(), StringType())


def schema(*fields: tuple[str, DataType] | tuple[str, DataType, bool]) -> StructType:
    return StructType([StructField(*f) for f in fields])


SCHEMAS = {
    "body+offset": schema(("body", BinaryType()), ("offset", LongType())),
    "reordered": schema(("Offset", LongType(), False), ("message_id", StringType()), ("headers", HEADERS), ("queue", StringType())),
    "properties": schema(
        ("timestamp", TimestampType()),
        ("exchange", StringType()),
        ("routing_key", StringType()),
        ("delivery_mode", IntegerType()),
        ("priority", IntegerType()),
        ("content_type", StringType()),
        ("raw_header", BinaryType()),
    ),
}


def publish_with_properties(url: str, stream: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(N):
        props = pika.BasicProperties(
            message_id=f"m{i}",
            correlation_id=f"c{i // 3}",
            content_type="application/json",
            timestamp=1_767_225_600 + i,
            priority=i % 5,
            delivery_mode=2,
            headers={"tenant": f"t{i % 3}", "attempt": i, "x-stream-filter-value": f"t{i % 3}"},
        )
        ch.basic_publish("", stream, b'{"i": %d}' % i, props)
    conn.close()


def table(batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches)


@pytest.mark.parametrize("which", list(SCHEMAS))
def test_the_batches_hold_the_columns_asked_for_with_a_full_read_s_values(
    amqp_url: str, names: Any, which: str, broker_version: tuple[int, int]
) -> None:
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish_with_properties(amqp_url, s)
    full = table(list(read_range(options(amqp_url, s), StreamRange(s, 0, N), 7)))
    filtered = [{"filter": "t1,t2"}] if broker_version >= (3, 13) else []  # RabbitMQ 3.13+ filters
    for extra in [{}, *filtered]:  # a row filter reads the filter value whatever the columns asked for
        opts = options(amqp_url, s, SCHEMAS[which], **extra)
        assert opts.columns is not None
        batches = list(read_range(opts, StreamRange(s, 0, N), 7))  # small batches: the core's and Python's rows meet
        assert batches and all(b.schema.equals(opts.columns.schema) for b in batches), [b.schema for b in batches]
        got = table(batches)
        kept = [i for i, h in enumerate(full.column("headers").to_pylist()) if not extra or dict(h)["tenant"] != "t0"]
        for name, label in zip(opts.columns.names, opts.columns.labels, strict=True):
            want = [full.column(name)[i].as_py() for i in kept]
            assert got.column(label).to_pylist() == want, (label, extra)


def core_reads(read_over: str, broker_version: tuple[int, int]) -> bool:
    """Whether the compiled core makes the rows (else Python does): over the stream protocol and AMQP 1.0, where it is
    installed, from RabbitMQ 4.x (3.x's conversion is Python's alone)."""
    return core.CORE is not None and read_over in ("stream-protocol", "amqp1.0") and broker_version >= (4, 0)


def test_body_and_offset_decode_no_message_s_properties(
    amqp_url: str, names: Any, read_over: str, broker_version: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish_with_properties(amqp_url, s)
    decoded: list[str] = []
    real_properties, real_columns = properties.decode_properties, rows._columns
    monkeypatch.setattr(properties, "decode_properties", lambda *a: decoded.append("0-9-1") or real_properties(*a))
    monkeypatch.setattr(rows, "_columns", lambda *a: decoded.append("1.0") or real_columns(*a))
    if core.CORE is not None:  # over AMQP 0-9-1 the core decodes a batch's content headers (reading.core_properties)
        real_basic = core.CORE.basic_properties
        monkeypatch.setattr(core.CORE, "basic_properties", lambda *a: decoded.append("0-9-1 (core)") or real_basic(*a))
    got = table(list(read_range(options(amqp_url, s, SCHEMAS["body+offset"]), StreamRange(s, 0, N), 7)))
    assert got.column("offset").to_pylist() == list(range(N)) and got.column("body").to_pylist()[3] == b'{"i": 3}'
    assert decoded == [], "no property column asked for: none decoded"
    table(list(read_range(options(amqp_url, s), StreamRange(s, 0, N), 7)))
    assert bool(decoded) != core_reads(read_over, broker_version), "the check sees a full read decode them (where Python makes rows)"


def test_a_message_whose_properties_cannot_be_decoded_reads_as_body_and_offset(
    amqp_url: str, names: Any, read_over: str, broker_version: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if read_over != "stream-protocol":
        pytest.skip("RabbitMQ delivers no such message over AMQP 0-9-1 or 1.0: it cannot convert it (541)")
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    good = amqp10.encode(b"ok", properties=["id-0"], application_properties={"k": "v"})
    bad = b"\x00\x53\x73\xc0\x02\x01\xff" + b"\x00\x53\x75\xa0\x04kept"  # a list of one value of no known type, sized right
    run(reading_url(amqp_url), lambda client: publish_records(client, s, [good, bad, good]))
    taken: list[bool] = []
    add_chunk = held.HeldRows.add_chunk
    monkeypatch.setattr(held.HeldRows, "add_chunk", lambda self, *a: taken.append(add_chunk(self, *a)) or taken[-1])
    with pytest.raises(AmqpSourceError, match=f"stream '{s}'"):
        list(read_range(options(amqp_url, s), StreamRange(s, 0, 3)))
    assert not all(taken), "a full read: the core leaves the message's chunk to Python, which fails the task"
    taken.clear()
    got = table(list(read_range(options(amqp_url, s, SCHEMAS["body+offset"]), StreamRange(s, 0, 3))))
    assert got.to_pydict() == {"body": [b"ok", b"kept", b"ok"], "offset": [0, 1, 2]}
    assert taken and all(taken) == core_reads(read_over, broker_version), "the core took every chunk itself, decoding nothing"
    headers = table(list(read_range(options(amqp_url, s, schema(("headers", HEADERS))), StreamRange(s, 0, 1))))
    assert headers.column("headers").to_pylist() == [[("k", "v")]]
