"""Filter expressions RabbitMQ evaluates for AMQP 1.0 stream consumers (options filterProperties,
filterApplicationProperties: 4.1+; filterSql: 4.2+): exactly the matching offsets of a range, in order, and an end
found although the offsets after the last match never come; a broker that does not take a filter is a clear error
before any row is read. Each RabbitMQ 4.x in the run (``url``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

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


def _fill(url: str, stream: str, count: int, priorities: bool = False) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        # application property 'color'; property correlation-id 'c<i % 10>'
        headers = {"color": COLORS[i % 4], "n": i, **({"b": i % 2 == 0} if priorities else {})}
        props = pika.BasicProperties(
            message_id=f"m{i}", correlation_id=f"c{i % 10}", headers=headers, priority=i % 3 if priorities else None
        )
        ch.basic_publish("", stream, f"b{i}".encode(), props)
    conn.close()


def _options(url: str, stream: str, **filters: object) -> object:
    extra = {k: v if isinstance(v, str) else json.dumps(v) for k, v in filters.items()}
    return parse_stream_options({"uri": url, "stream": stream, "protocol": "amqp1.0", "connectionTimeout": "20", **extra})


def _offsets(opts: object, part: StreamRange, batch_rows: int = 10_000) -> list[int]:
    return [o for batch in read_range(opts, part, batch_rows) for o in batch.column("offset").to_pylist()]  # type: ignore[arg-type]


def _needs(url: str, version: tuple[int, int]) -> None:
    if not amqp10_fixtures.is_embedded(url) and version_of(url) < version:  # the embedded broker is 4.3
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


# SQL as RabbitMQ 4.3.6 evaluated each expression here (and the embedded broker must): offset i has application
# properties color COLORS[i % 4], n i and b (i even), correlation-id c<i % 10>, message-id m<i>, priority i % 3.
SQL_CASES: list[tuple[str, Callable[[int], bool] | None]] = [
    ("p.correlation_id = 'c3'", lambda i: i % 10 == 3),
    ("properties.correlation_id = 'c3' AND a.color = 'green'", lambda i: i % 10 == 3 and i % 2 == 1),
    ("application_properties.color = 'red'", lambda i: i % 4 == 0),
    ("h.priority = 1", lambda i: i % 3 == 1),
    ("color LIKE '%ee%'", lambda i: i % 2 == 1),
    ("color LIKE 'gr_en' AND NOT color NOT LIKE 'g%'", lambda i: i % 2 == 1),
    ("p.message_id LIKE 'm1_'", lambda i: 10 <= i <= 19),
    ("color LIKE 'r!%' ESCAPE '!'", lambda i: False),
    ("n % 7 = 0", lambda i: i % 7 == 0),
    ("n / 2 = 3.5 OR n * 2 + 1 = 11 OR -n = -3", lambda i: i in (7, 5, 3)),
    ("n / 0 = 1 OR n = 0", lambda i: i == 0),
    ("n IN (1, 2, 3) OR n NOT IN (1, 2, 3) AND n > 37", lambda i: i in (1, 2, 3, 38, 39)),
    ("missing IS NULL AND n < 3", lambda i: i < 3),
    ("missing IS NOT NULL OR missing = 1 OR NOT missing = 1", lambda i: False),
    ("NOT b AND n < 6", lambda i: i in (1, 3, 5)),
    ("b = TRUE AND n < 6", lambda i: i in (0, 2, 4)),
    ("n = '3' OR color > 'green' AND n > 30", lambda i: i > 30 and i % 4 == 0),
    ("(color = 'red' OR color = 'blue') AND n > 30", lambda i: i > 30 and i % 2 == 0),
    ("n <> 3 AND n != 4 AND n < 6 AND n = 1.0 + n - 1", lambda i: i in (0, 1, 2, 5)),
    ("p.subject IS NULL AND p.to IS NULL AND UTC() > 0 AND n < 2", lambda i: i < 2),
    ("'red' = color AND n < 10", lambda i: i in (0, 4, 8)),
    ("TRUE", lambda i: True),
    # Not taken by RabbitMQ 4.3: a property's name with '-', BETWEEN, an exponent without a decimal point.
    ("p.correlation-id = 'c3'", None),
    ("n BETWEEN 1 AND 3", None),
    ("n = 1e0", None),
]


def test_sql_filter_expressions_one_by_one(url: str, stream: str) -> None:  # type: ignore[no-untyped-def]
    _needs(url, (4, 2))
    s = stream
    _fill(url, s, 40, priorities=True)
    for sql, matching in SQL_CASES:
        opts = _options(url, s, filterSql=sql)
        if matching is None:
            with pytest.raises(AmqpSourceError, match="did not take option 'filterSql'"):
                _offsets(opts, StreamRange(s, 0, 40))
        else:
            assert _offsets(opts, StreamRange(s, 0, 40)) == [i for i in range(40) if matching(i)], sql


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
