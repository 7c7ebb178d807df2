"""Stream mode over AMQP 0-9-1 while a stream's leader fails over, on the embedded broker: RabbitMQ refuses
``basic.consume`` with ``406 … does not have a running replica on the local node`` until the node's replica
has restarted (a few seconds), and the reader and the planner wait that out instead of failing the query.
The same on a real cluster: ``tests/cluster``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.streams.options import StreamSourceOptions, parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange

from .helpers import declare_stream, publish

pytestmark = [pytest.mark.streams, pytest.mark.embedded_only]

STREAM = "failover"
REFUSAL = "does not have a running replica on the local node"


@pytest.fixture
def stream(embedded: EmbeddedBroker) -> Iterator[EmbeddedBroker]:
    declare_stream(embedded.url, STREAM)
    publish(embedded.url, STREAM, 0, 50)
    yield embedded


def options(uri: str) -> StreamSourceOptions:
    return parse_stream_options({"uri": uri, "stream": STREAM, "connectionTimeout": "5"})


def offsets(opts: StreamSourceOptions, start: int, end: int) -> list[int]:
    return [o for batch in read_range(opts, StreamRange(STREAM, start, end)) for o in batch.column("offset").to_pylist()]


def test_a_range_read_waits_for_the_replica(stream: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    stream.refuse_stream_consumers(3)
    with caplog.at_level(logging.WARNING, logger="spark_amqp.streams"):
        began = time.monotonic()
        assert offsets(options(stream.url), 10, 50) == list(range(10, 50))
    assert time.monotonic() - began < 5.0
    assert sum(REFUSAL in r.getMessage() for r in caplog.records) == 3


def test_a_range_read_on_a_uri_of_several_nodes(stream: EmbeddedBroker) -> None:
    stream.refuse_stream_consumers(2)
    live = stream.url.split("@", 1)[1].split("/", 1)[0]
    uri = stream.url.replace(live, f"127.0.0.1:1,{live},127.0.0.1:2")
    assert offsets(options(uri), 0, 50) == list(range(50))


def test_the_planner_asks_again(stream: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    stream.refuse_stream_consumers(2)
    planner = StreamPlanner(options(stream.url))
    try:
        with caplog.at_level(logging.WARNING, logger="spark_amqp.client"):
            assert planner.ends() == {STREAM: 50}
        assert sum(REFUSAL in r.getMessage() for r in caplog.records) == 2
    finally:
        planner.close()
