"""PySpark 4.0's streaming writer hands rows, not Arrow: rows become Arrow batches of the input's own schema."""

from __future__ import annotations

import datetime

from pamqp import commands, header
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType, TimestampType

from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.writer import _rows_to_batches, arrow_schema

SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("priority", IntegerType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", MapType(StringType(), StringType())),
    ]
)


def _properties(header_payload: bytes) -> commands.Basic.Properties:
    content = header.ContentHeader()
    content.unmarshal(header_payload)
    return content.properties


def test_each_row_keeps_its_own_header_keys_and_values() -> None:
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    rows = [
        Row(body=b"a", priority=1, timestamp=when.astimezone().replace(tzinfo=None), headers={"only-a": "1"}),
        Row(body=b"b", priority=None, timestamp=None, headers={"only-b": "2", "shared": "x"}),
        Row(body=b"c", priority=3, timestamp=None, headers=None),
    ]
    batches = list(_rows_to_batches(iter(rows), arrow_schema(SCHEMA)))
    builder = MessageBuilder(parse_sink_options({"uri": "amqp://h/"}))
    props = [_properties(m.header) for b in batches for m in builder.messages(b)]
    assert [p.headers for p in props] == [{"only-a": "1"}, {"only-b": "2", "shared": "x"}, None]
    assert [p.priority for p in props] == [1, None, 3]
    # A naive TIMESTAMP from a row is local time: the message carries the same instant.
    assert props[0].timestamp == when.replace(tzinfo=None) or props[0].timestamp == when


def test_rows_are_chunked_into_batches() -> None:
    rows = [Row(body=b"%d" % i, priority=None, timestamp=None, headers=None) for i in range(10)]
    batches = list(_rows_to_batches(iter(rows), arrow_schema(SCHEMA), chunk=4))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert batches[0].schema == arrow_schema(SCHEMA)


def test_a_dataframe_read_from_a_stream_is_accepted_as_it_is() -> None:
    from pyspark.sql.types import LongType

    from spark_amqp.reading.arrow import STREAM_SCHEMA_DDL
    from spark_amqp.sink.columns import check_schema

    check_schema(
        StructType([StructField("body", BinaryType()), StructField("offset", LongType()), StructField("queue", StringType())]),
        parse_sink_options({"uri": "amqp://h/"}),
    )
    assert "offset BIGINT" in STREAM_SCHEMA_DDL  # the column stream mode adds, which the sink ignores


def test_the_routing_key_cache_stays_bounded_with_a_key_per_row() -> None:
    import pyarrow as pa

    from spark_amqp.sink.columns import SHORTSTR_CACHE_MAX

    builder = MessageBuilder(parse_sink_options({"uri": "amqp://h/"}))
    for start in range(0, 5 * SHORTSTR_CACHE_MAX, 5000):
        keys = [f"order-{i}" for i in range(start, start + 5000)]
        batch = pa.RecordBatch.from_pydict({"body": [b"x"] * len(keys), "routing_key": keys})
        assert [m.routing_key[1:].decode() for m in builder.messages(batch)] == keys
        assert len(builder._shortstr_cache) <= SHORTSTR_CACHE_MAX + 5000
