"""A super stream read without superStreamPartitions: its partitions found by name, again before each
batch (one added is read from its first message, one gone is data loss). Both brokers."""

from __future__ import annotations

import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.streams.batch import StreamBatchReader
from spark_amqp.streams.offset import StreamOffset
from spark_amqp.streams.options import parse_stream_options

from .helpers import declare_stream, delete_queue, planner, publish, read_all

pytestmark = pytest.mark.streams


def _partition(url: str, names, base: str, i: int, first: int, count: int) -> str:  # type: ignore[no-untyped-def]
    name = f"{base}-{i}"
    names.queues.append(name)
    declare_stream(url, name)
    publish(url, name, first, count)
    return name


def test_partitions_are_found_by_name_and_again_before_each_batch(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    base = names.queue("super")
    parts = [_partition(amqp_url, names, base, i, 100 * i, 10 + i) for i in range(3)]
    p = planner(planners, parse_stream_options({"uri": amqp_url, "superStream": base, "connectionTimeout": "20"}))
    start = p.initial_offset()
    assert start == StreamOffset.of(dict.fromkeys(parts, 0))
    end = p.latest_offset(start.to_json(), None, True)
    assert end == StreamOffset.of({parts[0]: 10, parts[1]: 11, parts[2]: 12})
    # A partition added while the query runs: a batch of its own fixes its start at its first message ...
    added = _partition(amqp_url, names, base, 3, 300, 5)
    fixed = p.latest_offset(end.to_json(), None, True)
    assert fixed == StreamOffset.of({**end.as_dict(), added: 0}) and p.partitions(end.to_json(), fixed.to_json()) == []
    # ... and the next batch reads it.
    grown = p.latest_offset(fixed.to_json(), None, True)
    assert grown == StreamOffset.of({**end.as_dict(), added: 5})
    # A partition gone: what it held after the query's position would never be read.
    delete_queue(amqp_url, parts[2])
    with pytest.raises(AmqpSourceError, match=rf"stream '{parts[2]}' \(read up to offset 12\).*which super stream '{base}' no longer has"):
        p.latest_offset(grown.to_json(), None, True)


def test_a_super_stream_without_partitions_fails_naming_the_first(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    base = names.queue("super")
    p = planner(planners, parse_stream_options({"uri": amqp_url, "superStream": base}))
    with pytest.raises(AmqpSourceError, match=rf"super stream '{base}': no partition stream '{base}-0' found"):
        p.initial_offset()


def test_a_batch_read_finds_the_partitions_too(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    base = names.queue("super")
    for i in range(2):
        _partition(amqp_url, names, base, i, 100 * i, 3)
    rows = read_all(StreamBatchReader(parse_stream_options({"uri": amqp_url, "superStream": base})))
    assert sorted(m for _, m in rows) == ["m0", "m1", "m100", "m101", "m102", "m2"]
