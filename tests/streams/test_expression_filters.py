"""Filter expressions RabbitMQ evaluates for AMQP 1.0 stream consumers (options filterProperties,
filterApplicationProperties: 4.1+; filterSql: 4.2+): exactly the matching offsets of a range, in order, and an end
found although the offsets after the last match never come; a broker that does not take a filter is a clear error
before any row is read. Each RabbitMQ 4.x in the run (``url``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pika
import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange

from .. import amqp10_fixtures
from ..brokers import version_of
from .helpers import declare_stream, delete_queue

pytestmark = pytest.mark.streams
url = amqp10_fixtures.url  # each RabbitMQ 4.x of the run

COLORS = ("red", "green", "blue", "green")  # offset i is COLORS[i % 4]; reds are 0, 4, 8, ...


@pytest.fixture
def stream(url: str) -> Iterator[str]:  # not ``names``: it would run each test on every broker of the run too
    name = f"a10-filtered-{uuid.uuid4().hex[:10]}"
    declare_stream(url, name)
    yield name
    delete_queue(url, name)


def _fill(url: str, stream: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        # application property 'color'; property correlation-id 'c<i % 10>'
        props = pika.BasicProperties(message_id=f"m{i}", correlation_id=f"c{i % 10}", headers={"color": COLORS[i % 4], "n": i})
        ch.basic_publish("", stream, f"b{i}".encode(), props)
    conn.close()


def _options(url: str, stream: str, **filters: object) -> object:
    extra = {k: v if isinstance(v, str) else json.dumps(v) for k, v in filters.items()}
    return parse_stream_options({"uri": url, "stream": stream, "protocol": "amqp1.0", "connectionTimeout": "20", **extra})


def _offsets(opts: object, part: StreamRange, batch_rows: int = 10_000) -> list[int]:
    return [o for batch in read_range(opts, part, batch_rows) for o in batch.column("offset").to_pylist()]  # type: ignore[arg-type]


def _needs(url: str, version: tuple[int, int]) -> None:
    if amqp10_fixtures.is_embedded(url):
        pytest.skip("the embedded broker does not model filter expressions (docs/embedded-broker.md); the refusal test runs there")
    if version_of(url) < version:
        pytest.skip(f"RabbitMQ {version[0]}.{version[1]}+ (the test below checks how older ones refuse)")


def test_application_properties_filter_gives_exactly_the_matching_offsets_and_ends(url: str, stream: str) -> None:  # type: ignore[no-untyped-def]
    _needs(url, (4, 1))
    s = stream
    _fill(url, s, 2003)  # the last offsets (2001, 2002) do not match: the range's end must be found without them
    opts = _options(url, s, filterApplicationProperties={"color": "red"})
    assert _offsets(opts, StreamRange(s, 0, 2003), batch_rows=97) == list(range(0, 2003, 4))
    assert _offsets(opts, StreamRange(s, 101, 203)) == list(range(104, 203, 4))
    # A range where nothing matches ends too, empty.
    assert _offsets(opts, StreamRange(s, 1, 4)) == []


def test_properties_filter_takes_property_values_and_prefixes(url: str, stream: str) -> None:  # type: ignore[no-untyped-def]
    _needs(url, (4, 1))
    s = stream
    _fill(url, s, 300)
    opts = _options(url, s, filterProperties={"correlation-id": "c3"})
    assert _offsets(opts, StreamRange(s, 0, 300)) == list(range(3, 300, 10))
    # '&p:' asks for a prefix (AMQP filter expressions, 4.2.4); with an application property, both must match.
    opts = _options(url, s, filterProperties={"message-id": "&p:m1"}, filterApplicationProperties={"color": "green"})
    assert _offsets(opts, StreamRange(s, 0, 300)) == [i for i in range(300) if str(i).startswith("1") and COLORS[i % 4] == "green"]


def test_sql_filter(url: str, stream: str) -> None:  # type: ignore[no-untyped-def]
    _needs(url, (4, 2))
    s = stream
    _fill(url, s, 400)
    opts = _options(url, s, filterSql="color = 'blue' AND n >= 100 AND p.correlation_id <> 'c2'")
    assert _offsets(opts, StreamRange(s, 0, 400)) == [i for i in range(100, 400) if i % 4 == 2 and i % 10 != 2]


def test_a_filter_the_broker_does_not_take_fails_before_any_row_with_the_options_name(url: str, stream: str, planners) -> None:  # type: ignore[no-untyped-def]
    s = stream
    _fill(url, s, 10)
    if version_of(url) < (4, 1):
        opts, option = _options(url, s, filterApplicationProperties={"color": "red"}), "filterApplicationProperties"
    else:
        opts, option = _options(url, s, filterSql="color = = 'red'"), "filterSql"  # no broker parses it
    p = StreamPlanner(opts)  # type: ignore[arg-type]
    planners.append(p)
    with pytest.raises(AmqpSourceError, match=rf"did not take option '{option}'"):
        p.ends()
    with pytest.raises(AmqpSourceError, match=rf"did not take option '{option}'"):
        _offsets(opts, StreamRange(s, 0, 10))
