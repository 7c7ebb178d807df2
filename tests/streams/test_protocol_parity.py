"""The same stream planned and read over AMQP 0-9-1 and over the stream protocol gives the same offsets,
marks and rows: a checkpoint written over one protocol is read over the other."""

from __future__ import annotations

import json

import pytest

from spark_amqp.streams.offset import StreamOffset
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange

from ..brokers import STREAM_URLS
from .helpers import declare_stream, next_second, publish, stream_port

pytestmark = pytest.mark.streams


def _port(uri: str) -> dict[str, str]:
    return {} if uri.startswith("rabbitmq-stream") else stream_port(uri)


def _plan(uri: str, stream: str, **extra: str) -> tuple[StreamOffset, StreamOffset]:
    p = StreamPlanner(parse_stream_options({"uri": uri, "stream": stream, "connectionTimeout": "20", **_port(uri), **extra}))
    try:
        start = p.initial_offset()
        return start, p.latest_offset(start.to_json(), None, True)
    finally:
        p.close()


def _rows(uri: str, stream: str, start: int, end: int) -> list[tuple[object, ...]]:
    opts = parse_stream_options({"uri": uri, "stream": stream, "connectionTimeout": "20", **_port(uri)})
    return [tuple(sorted(r.items())) for b in read_range(opts, StreamRange(stream, start, end)) for r in b.to_pylist()]


def test_offsets_marks_and_rows_are_the_same_over_both_protocols(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    stream_url = STREAM_URLS.get(amqp_url)
    if stream_url is None:
        pytest.skip("this broker's stream protocol port is not known (AMQP_TEST_STREAM_BROKERS)")
    s = names.queue("stream")
    # Small segments: each new segment opens with a tracking chunk, an offset no reader sees.
    declare_stream(amqp_url, s, **{"x-stream-max-segment-size-bytes": 20_000})
    publish(amqp_url, s, 0, 300, size=200)
    moment = next_second()
    publish(amqp_url, s, 300, 300, size=200)
    for extra in ({}, {"startingOffsets": "last"}, {"startingTimestamp": str(moment * 1000)}):
        over_amqp, over_stream = _plan(amqp_url, s, **extra), _plan(stream_url, s, **extra)
        assert [json.dumps(o.to_json()) for o in over_amqp] == [json.dumps(o.to_json()) for o in over_stream], extra
    start, end = _plan(amqp_url, s)
    first, last = start.get(s), end.get(s)
    assert last > 600  # the tracking chunks took offsets of their own
    rows = _rows(amqp_url, s, first, last)
    assert len(rows) == 600 and rows == _rows(stream_url, s, first, last)
