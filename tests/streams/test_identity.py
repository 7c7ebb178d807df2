"""A stream deleted and declared again under a stopped query, then grown past its position: the marks in
the offset tell the new stream from the old one. Both brokers."""

from __future__ import annotations

import logging

import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.streams.offset import StreamOffset, mark_of

from .helpers import declare_stream, delete_queue, options, planner, publish, raises_within

pytestmark = pytest.mark.streams


def _read_to(p, s: str, end: int) -> StreamOffset:  # type: ignore[no-untyped-def]
    """The planner's next end once it reaches ``end`` (an end up to 0.1 s old may be reused)."""
    from ..broker.helpers import wait_for

    found: list[StreamOffset] = []
    assert wait_for(lambda: found.append(p.latest_offset({s: 0}, None, True)) or found[-1].get(s) == end, timeout=30, interval=0.02), found[
        -1:
    ]
    return found[-1]


def _checkpointed(url: str, names, planners) -> tuple[str, dict[str, object]]:  # type: ignore[no-untyped-def]
    """A stream of 20 messages, and the offset of a query that read it all and stopped."""
    s = names.queue("stream")
    declare_stream(url, s)
    publish(url, s, 0, 20)
    before = planner(planners, options(url, s))
    checkpoint = _read_to(before, s, 20).to_json()
    before.close()
    return s, checkpoint


def test_every_batch_end_carries_the_mark_of_the_message_before_it(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 40)
    p = planner(planners, options(amqp_url, s))
    end = _read_to(p, s, 40)
    assert end.mark(s) == mark_of(b"b39") and end.to_json() == {s: [40, mark_of(b"b39")]}
    limited = p.latest_offset({s: 0}, 15, True)  # stops short of the end: one probe at offset 14
    assert limited.as_dict() == {s: 15} and limited.mark(s) == mark_of(b"b14")
    # Nothing new: the start comes back as it was, mark and all, so Spark plans no batch.
    assert p.latest_offset(end.to_json(), None, True).key == end.key


@pytest.mark.parametrize("fail_on_data_loss", [True, False], ids=["fail", "skip"])
def test_a_stream_declared_again_and_grown_past_the_checkpoint_is_told_apart_on_restart(  # type: ignore[no-untyped-def]
    amqp_url: str, names, planners, fail_on_data_loss: bool, caplog
) -> None:
    s, checkpoint = _checkpointed(amqp_url, names, planners)
    delete_queue(amqp_url, s)
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 100, 30)  # other bodies, and past the checkpoint's position
    restarted = planner(planners, options(amqp_url, s, failOnDataLoss=str(fail_on_data_loss).lower()))
    expected = f"stream '{s}' holds another message at offset 19 than when this query read it"
    if fail_on_data_loss:
        with pytest.raises(AmqpSourceError, match=expected):
            restarted.latest_offset(checkpoint, None, True)
        replay = planner(planners, options(amqp_url, s))  # Spark replays a logged batch: partitions() first
        with pytest.raises(AmqpSourceError, match=expected):
            replay.partitions({s: 0}, checkpoint)
    else:
        with caplog.at_level(logging.WARNING, logger="spark_amqp.streams"):
            assert restarted.latest_offset(checkpoint, None, True).as_dict() == {s: 30}
        assert expected in caplog.text and "failOnDataLoss=false" in caplog.text


def test_the_same_stream_passes_the_check_after_a_restart(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    s, checkpoint = _checkpointed(amqp_url, names, planners)
    publish(amqp_url, s, 20, 10)
    restarted = planner(planners, options(amqp_url, s))
    assert restarted.partitions({s: 0}, checkpoint)  # the replayed batch reads the same stream
    assert restarted.latest_offset(checkpoint, None, True).as_dict() == {s: 30}
    # A checkpoint written before marks (a plain number) is read as it always was, unchecked.
    assert restarted.latest_offset({s: 20}, None, True).as_dict() == {s: 30}


def test_a_stream_declared_again_under_a_running_query_is_told_apart(amqp_url: str, names, planners) -> None:  # type: ignore[no-untyped-def]
    # The tail watcher's basic.cancel makes the planner check its own position again.
    s = names.queue("stream")
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 0, 20)
    p = planner(planners, options(amqp_url, s))
    end = _read_to(p, s, 20).to_json()
    delete_queue(amqp_url, s)
    declare_stream(amqp_url, s)
    publish(amqp_url, s, 100, 30)
    message = raises_within(lambda: p.latest_offset(end, None, True), timeout=40)
    assert f"stream '{s}' holds another message at offset 19" in message, message
