"""spark.read of a stream without Spark: the bounds a batch read resolves on the driver, and its
ranges read back exactly. Both brokers."""

from __future__ import annotations

import json

import pytest

from spark_amqp.errors import AmqpOptionError, AmqpSourceError, BrokerUnreachable
from spark_amqp.streams.batch import StreamBatchReader, resolve_bounds
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.planner import StreamPlanner

from .helpers import declare_stream, next_second, options, publish, read_all, truncated_stream

pytestmark = pytest.mark.streams


def test_a_range_by_offsets_is_read_exactly_and_again_the_same(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 100)
    bounded = StreamBatchReader(
        options(amqp_url, s, startingOffsets=json.dumps({s: 10}), endingOffsets=json.dumps({s: 60}), numPartitions="3")
    )
    assert len(bounded.partitions()) == 3
    first = read_all(bounded)
    assert sorted(first) == [(i, f"m{i}") for i in range(10, 60)]
    publish(amqp_url, s, 100, 20)  # written since: outside the bounds
    assert read_all(bounded) == first
    assert sorted(read_all(StreamBatchReader(options(amqp_url, s)))) == [(i, f"m{i}") for i in range(120)]  # first .. latest
    assert read_all(StreamBatchReader(options(amqp_url, s, startingOffsets="last"))) == [(119, "m119")]
    assert read_all(StreamBatchReader(options(amqp_url, s, startingOffsets="latest"))) == []


def test_a_range_by_timestamps(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    # Timestamps are per chunk and to the second over AMQP 0-9-1: the bounds are second boundaries.
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 10)
    first = next_second()
    publish(amqp_url, s, 10, 10)
    second = next_second()
    publish(amqp_url, s, 20, 10)
    day = StreamBatchReader(options(amqp_url, s, startingTimestamp=str(first * 1000), endingTimestamp=str(second * 1000)))
    assert sorted(read_all(day)) == [(i, f"m{i}") for i in range(10, 20)]
    by_stream = StreamBatchReader(options(amqp_url, s, startingOffsetsByTimestamp=json.dumps({s: second * 1000})))
    assert sorted(read_all(by_stream)) == [(i, f"m{i}") for i in range(20, 30)]
    before = StreamBatchReader(options(amqp_url, s, endingOffsetsByTimestamp=json.dumps({s: first * 1000})))
    assert sorted(read_all(before)) == [(i, f"m{i}") for i in range(10)]
    # A moment nothing follows: the end as the read is planned (a probe waits connectionTimeout for it).
    later = options(amqp_url, s, startingTimestamp=str((second + 3600) * 1000), connectionTimeout="2")
    assert resolve_bounds(later) == ({s: 30}, {s: 30})


def test_bounds_past_the_end_or_crossed_name_the_option(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 10)
    with pytest.raises(AmqpOptionError, match=rf"option 'endingOffsets' ends stream '{s}' at offset 11, past its end .* 10\b"):
        resolve_bounds(options(amqp_url, s, endingOffsets=json.dumps({s: 11})))
    with pytest.raises(AmqpOptionError, match=rf"option 'startingOffsets' starts stream '{s}' at offset 12, past its end"):
        resolve_bounds(options(amqp_url, s, startingOffsets=json.dumps({s: 12})))
    with pytest.raises(AmqpOptionError, match=rf"stream '{s}': the read would start at offset 8 but end before offset 4"):
        resolve_bounds(options(amqp_url, s, startingOffsets=json.dumps({s: 8}), endingOffsets=json.dumps({s: 4})))


def test_a_streaming_query_refuses_ending_options(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AmqpOptionError, match="'endingOffsets', 'endingTimestamp' and 'endingOffsetsByTimestamp' bound a batch read"):
        StreamPlanner(options(amqp_url, "s", endingOffsets="latest"))


def test_retention_past_the_start_fails_or_is_skipped(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    head = truncated_stream(amqp_url, s)
    bounds = {"startingOffsets": json.dumps({s: 0}), "endingOffsets": json.dumps({s: head + 5})}
    with pytest.raises(AmqpSourceError, match=rf"stream '{s}': offsets 0 to {head - 1} \({head}\) were removed"):
        read_all(StreamBatchReader(options(amqp_url, s, **bounds)))
    lenient = read_all(StreamBatchReader(options(amqp_url, s, failOnDataLoss="false", **bounds)))
    assert sorted(o for o, _ in lenient) == list(range(head, head + 5))


def test_a_batch_read_that_cannot_connect_names_the_stream_not_the_filter() -> None:
    """Every spark.read of a stream reported connection failures as "option 'filter' on …", filter or not."""
    o = parse_stream_options({"uri": "rabbitmq-stream://127.0.0.1:1/%2F", "stream": "events", "connectionTimeout": "0.5"})
    with pytest.raises(BrokerUnreachable, match=r"^stream 'events' on rabbitmq-stream://guest@127.0.0.1:1/%2F: cannot connect"):
        resolve_bounds(o)
