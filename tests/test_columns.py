"""The columns a query asks for with ``.schema(...)`` (reading/projection.py): checked with the options, before anything
connects, every bad schema refused with an error that names the column and says what it must be, never the password;
and the batches a projection makes, without a broker."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_amqp.client.properties import LazyProperties
from spark_amqp.datasource import AmqpDataSource
from spark_amqp.errors import AmqpOptionError
from spark_amqp.queues.options import parse_source_options
from spark_amqp.reading import arrow
from spark_amqp.reading.projection import Projection, projection
from spark_amqp.streams.options import parse_stream_options

PASSWORD = "s3cret-pw"
STREAM = {"uri": "rabbitmq-stream://etl@rabbit.internal:5552/prod", "password": PASSWORD, "stream": "events"}
QUEUE = {"uri": f"amqp://etl:{PASSWORD}@rabbit.internal/prod", "queue": "orders"}


def schema(*fields: tuple[str, DataType] | tuple[str, DataType, bool]) -> StructType:
    return StructType([StructField(*f) for f in fields])


def test_a_subset_in_any_order_and_case_is_read_under_the_declared_names() -> None:
    p = parse_stream_options(
        STREAM, schema(("offset", LongType(), False), ("Body", BinaryType()), ("HEADERS", MapType(StringType(), StringType())))
    )
    assert p.columns == Projection("stream", ("offset", "body", "headers"), ("offset", "Body", "HEADERS"), (True, False, False))
    assert p.columns.schema == pa.schema([pa.field("offset", pa.int64(), False), ("Body", pa.binary()), ("HEADERS", arrow.HEADERS_TYPE)])
    assert p.made == ("offset", "body", "headers") and p.columns.properties == ("headers",)
    filtered = parse_stream_options({**STREAM, "filter": "eu"}, schema(("body", BinaryType())))
    assert filtered.made == ("body", "headers"), "the row filter reads a header"
    q = parse_source_options(QUEUE, schema(("delivery_tag", LongType()), ("message_id", StringType())))
    assert q.columns is not None and q.columns.names == ("delivery_tag", "message_id")


def test_the_source_s_own_schema_or_none_is_every_column() -> None:
    # What Spark passes the reader when the query gives no schema: the source's own, which schema() names.
    assert parse_stream_options(STREAM, from_arrow_schema(arrow.STREAM_ARROW_SCHEMA)).columns is None
    assert parse_source_options(QUEUE, from_arrow_schema(arrow.ARROW_SCHEMA)).columns is None
    assert parse_stream_options(STREAM).columns is None and parse_source_options(QUEUE).columns is None
    reordered = from_arrow_schema(arrow.STREAM_ARROW_SCHEMA)
    reordered = StructType(reordered.fields[1:] + reordered.fields[:1])
    assert projection(reordered, "stream") is not None, "every column in another order is a projection too"


@pytest.mark.parametrize(
    ("mode", "fields", "said"),
    [
        (
            "stream",
            [("body", BinaryType()), ("offset", IntegerType())],
            "column 'offset' must be BIGINT .*not INT: declare it `offset BIGINT`",
        ),
        ("stream", [("timestamp", LongType())], "column 'timestamp' must be TIMESTAMP .*not BIGINT"),
        ("stream", [("timestamp", TimestampNTZType())], "not TIMESTAMP_NTZ: declare it `timestamp TIMESTAMP_LTZ`"),
        ("queue", [("headers", MapType(StringType(), StringType(), False))], "column 'headers' must be MAP<STRING,STRING>"),
        ("queue", [("body", StringType())], "column 'body' must be BINARY .*not STRING"),
        (
            "stream",
            [("delivery_tag", LongType())],
            "column 'delivery_tag' is a queue's \\(option 'queue'\\), not a stream's. A stream's columns",
        ),
        (
            "queue",
            [("body", BinaryType()), ("offset", LongType())],
            "column 'offset' is a stream's .*not a queue's. A queue's columns .*: body, queue",
        ),
        ("stream", [("msg_id", StringType())], "column 'msg_id' is not a column of this source. A stream's columns .*message_id"),
        (
            "stream",
            [("message_id", StringType(), False)],
            "column 'message_id' is null for messages without it: declare it without NOT NULL",
        ),
        ("stream", [("exchange", StringType(), False)], "column 'exchange' is null"),
        ("queue", [("body", BinaryType()), ("BODY", BinaryType())], "column 'BODY' is declared twice \\('body' and 'BODY'"),
        ("stream", [], "schema: no columns; name at least one of the source's: body, queue"),
    ],
)
def test_a_schema_that_is_not_a_subset_is_refused_naming_the_column(mode: str, fields: list[tuple[str, DataType]], said: str) -> None:
    options = STREAM if mode == "stream" else QUEUE
    source = AmqpDataSource(options)
    with pytest.raises(AmqpOptionError, match=said) as info:
        source.streamReader(schema(*fields))
    assert PASSWORD not in str(info.value)
    with pytest.raises(AmqpOptionError, match=said):  # spark.read checks the same, before a queue's read is refused
        source.reader(schema(*fields))


def test_columns_that_are_never_null_may_be_declared_not_null() -> None:
    p = projection(schema(("body", BinaryType(), False), ("queue", StringType(), False), ("offset", LongType(), False)), "stream")
    assert p is not None and all(p.required) and not any(f.nullable for f in p.schema)
    q = projection(schema(("delivery_tag", LongType(), False), ("redelivered", BooleanType(), False)), "queue")
    assert q is not None and q.required == (True, True)


def test_a_queue_batch_holds_the_columns_asked_for_and_decodes_no_property_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_amqp.client import properties
    from spark_amqp.stream_protocol import core

    monkeypatch.setattr(core, "CORE", None)  # Python's decoding counted (the core's: tests/queues/test_core_properties.py)
    decoded: list[bytes] = []
    real = properties.decode_properties
    monkeypatch.setattr(properties, "decode_properties", lambda plist: decoded.append(plist) or real(plist))
    header = struct.pack(">HHQH", 60, 0, 1, 0)  # a content header without properties
    with_id = struct.pack(">HHQH", 60, 0, 1, 1 << 7) + b"\x02id"  # message_id
    rows = [("s.1", "q", 1, False, "", "k", LazyProperties(header), b"a"), ("s.1", "q", 2, True, "x", "k", LazyProperties(with_id), b"b")]
    p = projection(schema(("Delivery_Tag", LongType()), ("body", BinaryType())), "queue")
    batch = arrow.to_record_batch(rows, p)
    assert batch.schema.names == ["Delivery_Tag", "body"] and batch.to_pydict() == {"Delivery_Tag": [1, 2], "body": [b"a", b"b"]}
    assert decoded == [], "no property column asked: no message's properties decoded"
    ids = arrow.to_record_batch(rows, projection(schema(("message_id", StringType()), ("timestamp", TimestampType())), "queue"))
    assert ids.to_pydict() == {"message_id": [None, "id"], "timestamp": [None, None]} and len(decoded) == 1
    full = arrow.to_record_batch(rows)
    assert p is not None and p.conform(full).equals(batch), "a journal's whole rows, as the projection reads them"
