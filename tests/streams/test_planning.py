"""Stream mode's pure parts: options, the offset's JSON form, range planning, admission."""

from __future__ import annotations

import itertools

import pytest

from spark_amqp.errors import AmqpOptionError, AmqpSourceError
from spark_amqp.queues.options import parse_source_options
from spark_amqp.reading.admission import Admission
from spark_amqp.reading.trigger import TriggerOptions
from spark_amqp.streams.offset import UNSET, StreamOffset
from spark_amqp.streams.options import At, is_stream_mode, parse_stream_options
from spark_amqp.streams.ranges import StreamRange, judge_gap, limit_ends, split

BASE = {"uri": "amqp://u@h:5672/v", "password": "pw"}


def opts(**extra: str):  # type: ignore[no-untyped-def]
    return parse_stream_options({**BASE, **extra})


def test_stream_mode_is_chosen_by_the_stream_options() -> None:
    assert is_stream_mode({"STREAM": "s"}) and is_stream_mode({"superStream": "s"}) and not is_stream_mode({"queue": "q"})
    o = opts(stream=" a, b ")
    assert o.streams == ("a", "b") and o.start_of("a") == o.start_of("b") == "first" and o.fail_on_data_loss
    assert o.trigger == TriggerOptions(None) and o.connection.password == "pw"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"stream": "s", "queue": "q"}, "'queue' and 'stream' exclude each other"),
        ({"stream": "s", "journalLocation": "/j"}, "needs no journal"),
        ({"stream": "s", "exclusiveConsumer": "true"}, "needs no exclusive consumer"),
        ({"stream": "s", "superStream": "t"}, "exclude each other"),
        ({"superStream": "t", "startingOffsets": '{"t-0": 5}'}, "partitions of super stream 't' are only found when the query runs"),
        ({"superStream": "t", "endingOffsetsByTimestamp": '{"t-0": 5}'}, "give 'superStreamPartitions' as well"),
        ({"superStream": "t" * 251}, "too long for its partition streams"),
        ({"stream": "s", "superStreamPartitions": "3"}, "only applies with option 'superStream'"),
        ({"stream": "s,s"}, "names a stream twice"),
        ({"stream": "s,"}, "empty name"),
        ({"stream": "s", "startingOffsets": "earliest"}, "first, last, next (or latest) or a JSON object"),
        ({"stream": "s", "startingOffsets": "[1]"}, "first, last, next (or latest) or a JSON object"),
        ({"stream": "s", "startingOffsets": "{1"}, "'startingOffsets' must be first, last, next (latest) or an offset"),
        ({"stream": "s,t", "startingOffsets": '{"s": 1}'}, "has no entry for: t"),
        ({"stream": "s", "startingOffsets": '{"s": 1, "u": 2}'}, "does not read: u"),
        ({"stream": "s", "startingOffsets": '{"s": -2}'}, "stream 's' has -2, which is not first, last, next (latest) or an offset"),
        ({"stream": "s", "startingOffsets": "first", "startingTimestamp": "1"}, "exclude each other"),
        ({"stream": "s", "startingTimestamp": "1", "startingOffsetsByTimestamp": '{"s": 1}'}, "exclude each other"),
        ({"stream": "s", "startingTimestamp": "-5"}, "'startingTimestamp' must be at least 0"),
        ({"stream": "s", "startingOffsetsByTimestamp": '{"s": "noon"}'}, "stream 's' has 'noon', which is not a JSON object of epoch"),
        ({"stream": "s", "endingOffsets": "first"}, "'endingOffsets' must be latest or a JSON object"),
        ({"stream": "s", "endingOffsets": '{"s": "last"}'}, "stream 's' has 'last', which is not latest or an offset"),
        ({"stream": "s", "endingOffsets": "latest", "endingTimestamp": "5"}, "exclude each other"),
        ({"stream": "s,t", "endingOffsetsByTimestamp": '{"t": 5}'}, "'endingOffsetsByTimestamp' has no entry for: s"),
        ({"stream": "s", "maxTriggerDelay": "1m"}, "only applies with option 'minMessagesPerTrigger'"),
        ({"stream": "s", "minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"}, "larger than 'maxMessagesPerTrigger'"),
        ({"stream": "s", "minMessagesPerTrigger": "10", "maxTriggerDelay": "soon"}, "must be a duration"),
        ({"stream": "s", "minMessagesPerTrigger": "10", "maxTriggerDelay": "2h"}, "between"),
        ({"stream": "s", "failOnDataLoss": "maybe"}, "true or false"),
        ({"stream": "s", "bogus": "1"}, "unknown option 'bogus'"),
    ],
)
def test_bad_stream_options_name_the_option(extra: dict[str, str], words: str) -> None:
    with pytest.raises(AmqpOptionError, match=words.replace("(", r"\(").replace(")", r"\)")):
        opts(**extra)


def test_starting_offsets_forms() -> None:
    assert opts(stream="s", startingOffsets="NEXT").start_of("s") == "next"
    o = opts(stream="s,t", startingOffsets='{"t": "last", "s": 42}')
    assert (o.start_of("s"), o.start_of("t")) == (42, "last")
    assert opts(stream="s", startingTimestamp="1700000000000").start_of("s") == At(1_700_000_000_000)
    assert opts(stream="s", startingOffsets="Latest").start_of("s") == "next"  # Kafka's word for it
    by_time = opts(stream="s,t", startingOffsetsByTimestamp='{"s": 5, "t": 7}', endingOffsets='{"s": 9, "t": "latest"}')
    assert (by_time.start_of("s"), by_time.start_of("t"), by_time.end_of("s"), by_time.end_of("t")) == (At(5), At(7), 9, "latest")
    assert opts(stream="s").end_of("s") == "latest" and opts(stream="s").ending == ()
    assert opts(stream="s", endingTimestamp="8").end_of("s") == At(8)
    sup = opts(superStream="inv", superStreamPartitions="3")
    assert sup.streams == ("inv-0", "inv-1", "inv-2") and sup.discover is None
    found = opts(superStream="inv", startingOffsets="next")  # partitions found by name when the query runs
    assert found.streams == () and found.discover == "inv" and found.start_of("inv-7") == "next"
    assert opts(stream="s", minMessagesPerTrigger="100", maxTriggerDelay="1.5m").trigger == TriggerOptions(None, 100, 90.0)


def test_queue_mode_takes_the_trigger_options_too() -> None:
    o = parse_source_options({**BASE, "queue": "q", "minMessagesPerTrigger": "500", "maxTriggerDelay": "250ms"})
    assert o.trigger == TriggerOptions(20_000, 500, 0.25)
    with pytest.raises(AmqpOptionError, match="larger than 'maxMessagesPerTrigger'"):
        parse_source_options({**BASE, "queue": "q", "minMessagesPerTrigger": "30000"})


def test_offset_json_is_sorted_and_round_trips() -> None:
    off = StreamOffset.of({"b": 7, "a": UNSET})
    assert off.key == '{"a":-1,"b":7}' and StreamOffset.from_json(off.key) == off
    assert off.get("missing") == UNSET and off.get("b") == 7
    for bad in ({"v": 1, "queues": {}}, {"a": "x"}, {"a": -2}, {"a": True}, [1]):
        with pytest.raises(AmqpSourceError, match="not a stream offset"):
            StreamOffset.from_json(bad)  # type: ignore[arg-type]


def test_limit_ends_shares_the_maximum_by_backlog_and_moves_every_stream() -> None:
    starts = {"a": 0, "b": 100, "c": 5}
    ends = {"a": 900, "b": 200, "c": 5}
    limited = limit_ends(starts, ends, 100)
    assert sum(limited[s] - starts[s] for s in starts) == 100
    assert limited == {"a": 90, "b": 110, "c": 5}
    assert limit_ends(starts, ends, 10_000) == ends
    tiny = limit_ends({"a": 0, "b": 0, "c": 0}, {"a": 10, "b": 10, "c": 10}, 2)
    assert sum(tiny.values()) == 2


def test_split_covers_each_range_exactly_once() -> None:
    ranges = split({"a": 10, "b": 0, "c": 3}, {"a": 1010, "b": 3, "c": 3}, 4, 50_000)
    assert all(r.size > 0 for r in ranges)
    for stream, lo, hi in (("a", 10, 1010), ("b", 0, 3)):
        mine = sorted((r.start, r.end) for r in ranges if r.stream == stream)
        assert mine[0][0] == lo and mine[-1][1] == hi and all(x[1] == y[0] for x, y in itertools.pairwise(mine))
    assert len([r for r in ranges if r.stream == "a"]) == 4 and not [r for r in ranges if r.stream == "c"]
    # one per minPartitionSize offsets when numPartitions is not set
    assert len(split({"a": 0}, {"a": 250}, None, 100)) == 3
    assert split({"a": 5}, {"a": 5}, 4, 100) == []
    assert split({"a": 0}, {"a": 2}, 8, 100) == [StreamRange("a", 0, 1), StreamRange("a", 1, 2)]


def test_admission_waits_for_the_minimum_until_the_delay_passes() -> None:
    a = Admission(TriggerOptions(1000, 100, 10.0))
    assert a.admit(5, now=0.0, max_rows=None, use_minimum=True) == 5  # the first batch of a run goes at once
    a.fired(0.0)
    assert a.admit(50, now=1.0, max_rows=None, use_minimum=True) == 0  # fewer than the minimum: wait
    assert a.admit(150, now=1.0, max_rows=None, use_minimum=True) == 150
    assert a.admit(5000, now=1.0, max_rows=None, use_minimum=True) == 1000  # the maximum
    assert a.admit(5000, now=1.0, max_rows=20, use_minimum=True) == 20  # Spark's ReadMaxRows
    assert a.admit(50, now=10.5, max_rows=None, use_minimum=True) == 50  # the delay passed
    assert a.admit(50, now=1.0, max_rows=None, use_minimum=False) == 50  # AvailableNow ignores the minimum
    assert a.admit(0, now=99.0, max_rows=None, use_minimum=True) == 0


@pytest.mark.parametrize(
    ("start", "first", "head", "verdict"),
    [
        (10, 11, 5, None),  # the stream still begins before the jump: offsets without messages
        (10, 11, 10, None),
        (10, 11, 11, (1, False)),  # the oldest segment's tracking chunk, or one message: cannot tell
        (10, 13, 13, (3, False)),
        (10, 50, 50, (40, True)),  # retention moved the stream's start past what was asked for
        (10, 500, 400, (40, True)),  # a jump past the range's end: only the range's part counts
        (10, 30, 20, (10, True)),  # the head has moved on since: what lay below it when the reader jumped
        (10, 30, None, (20, True)),  # the stream holds no message now
    ],
)
def test_judge_gap(start: int, first: int, head: int | None, verdict: tuple[int, bool] | None) -> None:
    assert judge_gap(StreamRange("s", 0, 50), start, first, head) == verdict


def test_offset_marks_round_trip_and_older_checkpoints_still_read() -> None:
    mark = "0123456789abcdef"
    off = StreamOffset.of({"a": 5, "b": 0, "c": UNSET}, {"a": mark, "b": mark, "c": mark})
    assert off.key == '{"a":[5,"0123456789abcdef"],"b":0,"c":-1}'  # no mark where nothing was read
    back = StreamOffset.from_json(off.key)
    assert back.mark("a") == mark and back.key == off.key
    assert StreamOffset.from_json({"a": 5}).mark("a") is None  # a checkpoint written before marks
    for bad in ({"a": [5, "short"]}, {"a": [5, 7]}, {"a": ["5", mark]}, {"a": [5, mark, 1]}):
        with pytest.raises(AmqpSourceError, match="not a stream offset"):
            StreamOffset.from_json(bad)
