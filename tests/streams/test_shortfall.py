"""A stream that ends before the offset a query has read it up to: a member still catching up (a replica added
back, a restarted node) is waited out; a stream deleted and declared again fails once that has lasted
brokerOutageTimeout. Seen in CI: a planner that asked the replica just added back failed its query.

Against a broker, a member catching up looks like a stream that holds fewer messages than the query's
position and then gains the rest: that is what the tests below publish. A query's first start there (issue 45) skips
nothing either: every start is at or before the one the whole stream gives."""

from __future__ import annotations

import json
import logging
import re
import threading
import time

import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.streams.offset import UNSET, StreamOffset
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.ranges import StreamRange
from spark_amqp.streams.shortfall import Shortfall

from ..broker.helpers import wait_for
from .helpers import declare_stream, latest, offsets_and_ids, options, planner, publish

# -- the decision, with the clock passed --------------------------------------------------------------------


def test_a_member_that_catches_up_within_the_timeout_costs_no_error() -> None:
    s = Shortfall(10.0)
    assert s.short("s", 1074, 2000, "said", now=100.0)
    assert s.short("s", 1500, 2000, "said", now=109.9)
    assert not s.short("s", 2000, 2000, "said", now=110.5)  # caught up: reads on
    # A later shortfall has a deadline of its own, not what is left of the first one's.
    assert s.short("s", 10, 2100, "said", now=200.0)
    assert s.short("s", 10, 2100, "said", now=209.0)


def test_a_reader_that_read_on_between_two_shortfalls_waits_the_second_one_afresh() -> None:
    # A range reader asks only when silent, so it never reports the member caught up: the position it waits for
    # tells one shortfall from the next.
    s = Shortfall(10.0)
    assert s.short("s", 40, 51, "said", now=0.0)
    assert s.short("s", 60, 81, "said", now=30.0)  # read on to 80 meanwhile: a new wait, not 30 s of the old one
    with pytest.raises(AmqpSourceError, match="still after 10s"):
        s.short("s", 60, 81, "said", now=40.0)


def test_a_shortfall_that_lasts_the_timeout_fails_naming_the_stream_and_the_option() -> None:
    s = Shortfall(10.0)
    assert s.short("s", 5, 20, "stream 's' ends at offset 5 but this query has read it up to 20", now=0.0)
    assert not s.short("t", 30, 20, "never short", now=5.0)  # streams are judged each on its own
    with pytest.raises(AmqpSourceError) as raised:
        s.short("s", 5, 20, "stream 's' ends at offset 5 but this query has read it up to 20", now=10.0)
    message = str(raised.value)
    assert message.startswith("stream 's' ends at offset 5 but this query has read it up to 20, still after 10s")
    assert "brokerOutageTimeout=10s" in message and "deleted and declared again" in message
    assert "new checkpointLocation" in message


# -- against a broker, over each protocol ---------------------------------------------------------------------


@pytest.mark.streams
@pytest.mark.usefixtures("read_over")
def test_the_planner_waits_for_a_member_that_ends_before_the_query_and_reads_on(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 5)
    p = planner(planners, options(amqp_url, s, brokerOutageTimeout="600s"))
    for _ in range(3):  # read up to 20 elsewhere; this member holds 5: no batch, no error
        assert p.latest_offset({s: 20}, None, True) == StreamOffset.of({s: 20})
    publish(amqp_url, s, 5, 20)  # it catches up, and more comes
    assert latest(p, {s: 20}, {s: 25})


@pytest.mark.streams
@pytest.mark.usefixtures("read_over")
def test_a_range_reader_waits_for_a_member_that_ends_before_its_range_and_reads_it_all(
    amqp_url: str, names, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 5)
    opts = options(amqp_url, s, connectionTimeout="1", brokerOutageTimeout="600s")
    got: list[list[tuple[int, str]]] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            got.append(offsets_and_ids(opts, StreamRange(s, 50, 100)))
        except BaseException as err:  # handed to the test below
            failed.append(err)

    caplog.set_level(logging.WARNING, logger="spark_amqp.streams")
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert wait_for(lambda: "a member still catching up" in caplog.text or failed, timeout=120)
    assert not failed, failed
    publish(amqp_url, s, 5, 100)
    reader.join(timeout=120)
    assert not failed, failed
    assert got == [[(i, f"m{i}") for i in range(50, 100)]]


@pytest.mark.streams
@pytest.mark.usefixtures("read_over")
def test_a_first_start_on_a_member_still_catching_up_skips_no_offset(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    """A query's very first start asks a member that holds 5 of the stream's 25 messages (it is catching up). Each
    startingOffsets gives a start at or before the one the whole stream would give, and the batches from there read
    every offset to the end: extra messages at worst, never a skipped one. An offset past the member's end fails the
    start, naming it (nothing read, nothing skipped; a start once the member caught up works)."""
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 5)
    whole = {"next": 25, "last": 24, "first": 0, json.dumps({s: 5}): 5}  # what each means on the whole stream
    fixed: dict[str, int] = {}
    for given in whole:
        p = planner(planners, options(amqp_url, s, startingOffsets=given))
        origin = p.initial_offset()
        start = p.latest_offset(origin.to_json(), None, True) if origin.get(s) == UNSET else origin  # next, last: fixed
        fixed[given] = start.get(s)
    with pytest.raises(AmqpSourceError, match=rf"starts stream '{s}' at offset 20, past its end \(the next offset it will write is 5\)"):
        planner(planners, options(amqp_url, s, startingOffsets=json.dumps({s: 20}))).initial_offset()
    publish(amqp_url, s, 5, 20)  # the member catches up
    for given, start in fixed.items():
        assert start <= whole[given], (given, start)
        p = planners[list(whole).index(given)]
        assert latest(p, {s: start}, {s: 25}), given  # one batch from the start to the end: every offset read
        assert [o for o, _ in offsets_and_ids(options(amqp_url, s), StreamRange(s, start, 25))] == list(range(start, 25))


# -- an availableNow run on a member behind where the stream ended when the run started ------------------------


def _available_now_on_a_member_behind(amqp_url: str, names, planners, **extra: str) -> tuple[StreamPlanner, str, StreamOffset]:  # type: ignore[no-untyped-def]
    """A run whose start measured the stream's end at 25 (the leader), planned since by a node whose member holds 5
    (catching up): its first batch reads those 5."""
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 5)
    p = planner(planners, options(amqp_url, s, startingOffsets="first", **extra))
    origin = p.initial_offset()
    p.prepare_available_now()
    assert p.available_now == {s: 5}
    p.available_now = {s: 25}
    first = p.latest_offset(origin.to_json(), None, False)
    assert first == StreamOffset.of({s: 5})
    return p, s, first


@pytest.mark.streams
@pytest.mark.usefixtures("read_over")
def test_an_available_now_run_waits_for_a_member_behind_where_the_stream_ended_when_it_started(
    amqp_url: str, names, planners, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """Spark ends an AvailableNow run at the first latestOffset that returns its start: before, this run ended there,
    "successfully", with offsets 5 to 24 unread."""
    p, s, first = _available_now_on_a_member_behind(amqp_url, names, planners, brokerOutageTimeout="600s")
    got: list[StreamOffset] = []
    failed: list[BaseException] = []

    def plan() -> None:
        try:
            got.append(p.latest_offset(first.to_json(), None, False))
        except BaseException as err:  # handed to the test below
            failed.append(err)

    caplog.set_level(logging.WARNING, logger="spark_amqp.streams")
    planning = threading.Thread(target=plan, daemon=True)
    planning.start()
    assert wait_for(lambda: "waiting up to brokerOutageTimeout" in caplog.text or not planning.is_alive(), timeout=60)
    assert not got and not failed, (got, failed)  # no batch yet, and the run goes on
    assert f"stream '{s}' ends at offset 5 on the node asked, before offset 25 where it ended" in caplog.text
    publish(amqp_url, s, 5, 20)  # the member catches up
    planning.join(timeout=60)
    assert not failed, failed
    assert got == [StreamOffset.of({s: 25})]
    assert p.latest_offset(got[0].to_json(), None, False) == got[0]  # the run is done


@pytest.mark.streams
@pytest.mark.usefixtures("read_over")
def test_an_available_now_run_whose_member_stays_behind_fails_after_broker_outage_timeout(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    p, s, first = _available_now_on_a_member_behind(amqp_url, names, planners, brokerOutageTimeout="1s")
    began = time.monotonic()
    with pytest.raises(AmqpSourceError) as raised:
        p.latest_offset(first.to_json(), None, False)
    assert 1 <= time.monotonic() - began < 30
    said = (
        f"stream '{re.escape(s)}' ends at offset 5 on the node asked, before offset 25 where it ended when this availableNow run "
        r"started, and the query has read it up to 5; still after \d+s \(brokerOutageTimeout=1s\): the run fails rather "
        "than end with those offsets unread"
    )
    assert re.match(said, str(raised.value)), str(raised.value)
