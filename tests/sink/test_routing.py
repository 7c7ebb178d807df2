"""The sink's super-stream routing and stream filter values: the same partitions as RabbitMQ's Java
stream client, a round trip through the stream source, and the refusals. Every broker."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from spark_amqp.errors import AmqpOptionError, AmqpPublishError
from spark_amqp.sink.columns import check_schema
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.routing import murmur3_32, partition_of
from spark_amqp.streams.batch import StreamBatchReader
from spark_amqp.streams.options import parse_stream_options

from ..brokers import version
from ..streams.helpers import declare_stream, stream_port
from .helpers import publish_table

# Printed by com.rabbitmq:stream-client 1.11.0's own HashRoutingStrategy.route() (java -cp, partitions
# p-0..p-(n-1)), not computed here: key -> (signed 32-bit hash, partition of 3, of 5, of 7).
JAVA_CLIENT = {
    "": (-965378730, 1, 1, 3),
    "a": (1086686554, 1, 4, 2),
    "order-1": (828619386, 0, 1, 0),
    "order-2": (1252507490, 2, 0, 3),
    "order-3": (-1172596906, 0, 0, 6),
    "customer-42": (80594573, 2, 3, 3),
    "hello": (1321743225, 0, 0, 5),
    "héllo wörld": (-935666341, 0, 0, 3),
    "日本": (-2064789264, 1, 2, 5),
    "0": (-1365801731, 2, 0, 4),
    "1": (-1848669458, 2, 3, 5),
    "12345": (1964441507, 2, 2, 0),
}


@pytest.mark.parametrize("key", sorted(JAVA_CLIENT))
def test_keys_go_where_the_java_stream_client_sends_them(key: str) -> None:
    signed, *where = JAVA_CLIENT[key]
    assert murmur3_32(key.encode("utf-8")) == signed & 0xFFFFFFFF
    # Negative hashes are where an `& 0x7FFFFFFF` mapping would differ: the client takes the remainder unsigned.
    assert [partition_of(key, n) for n in (3, 5, 7)] == where


def _super_stream(url: str, name: str, partitions: int) -> None:
    for i in range(partitions):
        declare_stream(url, f"{name}-{i}")


def _read_back(url: str, name: str, **extra: str) -> list[tuple[str, str, str]]:
    """(partition, body, routing key) of every message of the super stream, through the stream source."""
    given = {"uri": url, "superStream": name, "connectionTimeout": "20", **stream_port(url), **extra}
    reader = StreamBatchReader(parse_stream_options(given))
    return sorted(
        (q, b.decode(), k)
        for part in reader.partitions()
        for batch in reader.read(part)
        for q, b, k in zip(
            batch.column("queue").to_pylist(), batch.column("body").to_pylist(), batch.column("routing_key").to_pylist(), strict=True
        )
    )


def test_a_super_stream_write_reads_back_from_the_partitions_its_keys_pick(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    name = names.queue("orders")
    _super_stream(amqp_url, name, 3)
    keys = sorted(JAVA_CLIENT)
    # partition_key picks the partition; routing_key alone would be the key without it.
    result = publish_table(amqp_url, {"body": [f"m-{k}" for k in keys], "partition_key": keys}, superStream=name)
    assert result.confirmed == len(keys)
    publish_table(amqp_url, {"body": ["by-routing-key"], "routing_key": ["order-2"]}, superStream=name)
    expected = sorted(
        [(f"{name}-{JAVA_CLIENT[k][1]}", f"m-{k}", f"{name}-{JAVA_CLIENT[k][1]}") for k in keys]
        + [(f"{name}-2", "by-routing-key", f"{name}-2")]
    )
    assert _read_back(amqp_url, name) == expected


def test_a_partition_key_longer_than_a_routing_key_may_be_still_routes(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    # The key is only hashed: the message goes to its partition under the partition's name.
    name = names.queue("orders")
    _super_stream(amqp_url, name, 3)
    key = "customer-" + "x" * 300
    assert publish_table(amqp_url, {"body": ["long"], "partition_key": [key]}, superStream=name).confirmed == 1
    partition = f"{name}-{partition_of(key, 3)}"
    assert _read_back(amqp_url, name) == [(partition, "long", partition)]


def test_a_filter_value_column_lets_a_filtered_read_take_only_its_rows(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    name = names.queue("regions")
    _super_stream(amqp_url, name, 2)
    n = 300
    regions = [("eu", "us", "ap")[i % 3] if i % 10 else None for i in range(n)]
    publish_table(
        amqp_url,
        {"body": [str(i) for i in range(n)], "partition_key": [str(i) for i in range(n)], "region": regions},
        superStream=name,
        filterValueColumn="region",
    )
    wanted = sorted(str(i) for i in range(n) if regions[i] == "eu")
    if version(amqp_url) < (3, 13):
        with pytest.raises(Exception, match=r"option 'filter' needs RabbitMQ 3\.13"):
            _read_back(amqp_url, name, filter="eu")
        assert len(_read_back(amqp_url, name)) == n  # written all the same, with the header
        return
    assert sorted(b for _, b, _ in _read_back(amqp_url, name, filter="eu")) == wanted
    with_unfiltered = sorted(str(i) for i in range(n) if regions[i] in ("eu", None))
    assert sorted(b for _, b, _ in _read_back(amqp_url, name, filter="eu", filterMatchUnfiltered="true")) == with_unfiltered


def test_a_row_without_a_key_or_a_super_stream_without_partitions_publishes_nothing(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    name = names.queue("orders")
    _super_stream(amqp_url, name, 2)
    with pytest.raises(
        AmqpOptionError,
        match=r"column 'partition_key', row 1 of this partition \(null\): a row needs a key .* nothing of this partition was published",
    ):
        publish_table(amqp_url, {"body": ["a", "b"], "partition_key": ["k", None]}, superStream=name)
    assert _read_back(amqp_url, name) == []
    with pytest.raises(AmqpPublishError, match=rf"super stream '{name}-x': no partition stream '{name}-x-0' found.*nothing was published"):
        publish_table(amqp_url, {"body": ["a"], "partition_key": ["k"]}, superStream=f"{name}-x")


def test_super_stream_options_and_columns_are_checked_up_front() -> None:
    schema = StructType([StructField("body", BinaryType()), StructField("partition_key", StringType())])
    with pytest.raises(AmqpOptionError, match=r"unknown column\(s\) partition_key.*only with option superStream"):
        check_schema(schema, parse_sink_options({"uri": "amqp://h/"}))
    check_schema(schema, parse_sink_options({"uri": "amqp://h/", "superStream": "s"}))
    with_exchange = StructType([*schema.fields, StructField("exchange", StringType())])
    with pytest.raises(AmqpOptionError, match=r"column 'exchange' cannot be used with option superStream"):
        check_schema(with_exchange, parse_sink_options({"uri": "amqp://h/", "superStream": "s"}))
    with pytest.raises(AmqpOptionError, match=r"give a 'partition_key' or 'routing_key' column"):
        check_schema(StructType([StructField("body", BinaryType())]), parse_sink_options({"uri": "amqp://h/", "superStream": "s"}))
    with pytest.raises(AmqpOptionError, match=r"options 'superStream' and 'exchange' exclude each other"):
        parse_sink_options({"uri": "amqp://h/", "superStream": "s", "exchange": "x"})
    region = StructType([StructField("body", BinaryType()), StructField("region", BinaryType())])
    with pytest.raises(AmqpOptionError, match=r"column 'region' must be a string"):
        check_schema(region, parse_sink_options({"uri": "amqp://h/", "filterValueColumn": "region"}))
    with pytest.raises(AmqpOptionError, match=r"unknown column\(s\) region"):
        check_schema(region, parse_sink_options({"uri": "amqp://h/"}))


def test_murmur3_reference_values() -> None:
    # MurmurHash3_x86_32's published values with seed 0.
    assert murmur3_32(b"hello", 0) == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog", 0) == 0x2E4FF723
    assert murmur3_32(b"", 0) == 0
