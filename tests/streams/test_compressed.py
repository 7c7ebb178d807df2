"""Compressed sub-entries read over AMQP 0-9-1, on every broker: RabbitMQ never delivers them there (4.x skips them
without a word, 3.10 closes the connection), so a read that meets them fails at once, naming the stream, the offsets
and the codec; never a silent skip, never a stall. Over the stream protocol the same streams read whole."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from spark_amqp.errors import AmqpOptionError, AmqpSourceError
from spark_amqp.streams.batch import StreamBatchReader
from spark_amqp.streams.compressed import CompressedSubEntry
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.planner import StreamPlanner
from spark_amqp.streams.tails import REMEASURE

from ..broker.helpers import wait_for
from ..broker.raw import burst
from ..stream_protocol.conftest import stream_node
from .helpers import counted, declare_stream, delete_queue, publish, publish_compressed, read_all

__all__ = ["stream_node"]  # the fixture: each real node with its stream port, and the embedded broker

Node = tuple[str, str, str]


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1].split("/")[0]


@pytest.fixture
def stream(stream_node: Node) -> Iterator[str]:
    name = f"cmp-{uuid.uuid4().hex[:10]}"
    declare_stream(stream_node[2], name)
    yield name
    delete_queue(stream_node[2], name)


def _compressed(node: Node, stream: str, first: int, count: int, codec: str = "zstd") -> None:
    publish_compressed(node[1], stream, first, count, codec)


def _over_amqp(node: Node, stream: str, **extra: str) -> dict[str, str]:
    return {"uri": node[2], "stream": stream, "connectionTimeout": "20", "streamPort": _port(node[1]), **extra}


def _read(options: dict[str, str]) -> list[tuple[int, str]]:
    return read_all(StreamBatchReader(parse_stream_options(options)))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_range_holding_compressed_sub_entries_fails_at_once_naming_stream_offsets_and_codec(
    stream_node: Node, stream: str, codec: str
) -> None:
    publish(stream_node[2], stream, 0, 100)
    _compressed(stream_node, stream, 100, 200, codec)
    publish(stream_node[2], stream, 300, 100)
    started = time.monotonic()
    with pytest.raises(
        CompressedSubEntry, match=rf"stream '{stream}': offsets 100 to 199 are a sub-entry compressed with {codec}.*stream protocol"
    ):
        _read(_over_amqp(stream_node, stream))
    assert time.monotonic() - started < 20  # a question, not a wait for brokerOutageTimeout (2 min)
    # the same stream, whole, over the stream protocol
    rows = _read({"uri": stream_node[1], "stream": stream, "connectionTimeout": "20"})
    assert [i for i, _ in rows] == list(range(400)) and rows[100] == (100, "c100")


def test_a_stream_ending_in_compressed_sub_entries_is_not_read_as_ending_before_them(stream_node: Node, stream: str) -> None:
    publish(stream_node[2], stream, 0, 100)
    _compressed(stream_node, stream, 100, 200)
    # the last chunk's first sub-entry: the broker may have cut the two sub-entries into one chunk or two
    with pytest.raises(CompressedSubEntry, match=r"offsets (100 to 199|200 to 299) are a sub-entry compressed with zstd"):
        _read(_over_amqp(stream_node, stream))


def test_a_stream_of_compressed_sub_entries_only_is_not_read_as_empty(
    stream_node: Node, stream: str, planners: list[StreamPlanner]
) -> None:
    _compressed(stream_node, stream, 0, 200)
    with pytest.raises(CompressedSubEntry, match=r"offsets (0 to 99|100 to 199)"):  # one chunk or two
        _read(_over_amqp(stream_node, stream))
    planner = StreamPlanner(parse_stream_options(_over_amqp(stream_node, stream, startingOffsets="first")))
    planners.append(planner)
    with pytest.raises(CompressedSubEntry, match=r"offsets (0 to 99|100 to 199)"):  # a streaming query's planning too
        planner.latest_offset(None, None, True)


def test_a_filtered_read_asks_about_gaps_where_it_keeps_unfiltered_messages(stream_node: Node, stream: str) -> None:
    """A read with ``filter`` skips chunks without asking what they held (their Bloom filter does not match), but
    one with ``filterMatchUnfiltered`` keeps messages without a filter value, as compressed sub-entries are: it asks."""
    if stream_node[0] == "3.10":
        pytest.skip("filter needs RabbitMQ 3.13 (tests/streams/test_filtering.py checks the refusal)")
    burst(stream_node[2], stream, ["a", "b"] * 50)
    _compressed(stream_node, stream, 100, 100)
    burst(stream_node[2], stream, ["a", "b"] * 50)
    # Filter a alone: the compressed chunk holds nothing the read keeps; nothing is asked (port 1: nothing listens).
    rows = _read({**_over_amqp(stream_node, stream, streamPort="1", brokerOutageTimeout="20s"), "filter": "a"})
    assert [i for i, _ in rows] == [*range(0, 100, 2), *range(200, 300, 2)]
    with pytest.raises(CompressedSubEntry, match=rf"stream '{stream}': offsets 100 to 199 are a sub-entry compressed with zstd"):
        _read({**_over_amqp(stream_node, stream), "filter": "a", "filterMatchUnfiltered": "true"})


def test_uncompressed_sub_entries_are_delivered_over_amqp(stream_node: Node, stream: str) -> None:
    publish(stream_node[2], stream, 0, 50)
    _compressed(stream_node, stream, 50, 200, "none")
    rows = _read(_over_amqp(stream_node, stream))
    assert [i for i, _ in rows] == list(range(250)) and rows[50] == (50, "c50")


def test_offsets_the_tracking_chunks_of_new_segments_take_are_no_error(stream_node: Node) -> None:
    name = f"cmp-{uuid.uuid4().hex[:10]}"
    declare_stream(stream_node[2], name, **{"x-stream-max-segment-size-bytes": 1000})  # a segment every few messages
    try:
        publish(stream_node[2], name, 0, 60, size=100)
        offsets = [i for i, _ in _read(_over_amqp(stream_node, name))]
        assert len(offsets) == 60
        assert offsets[-1] > 59, "each segment after the first opens with a tracking chunk: offsets with gaps"
    finally:
        delete_queue(stream_node[2], name)


# Where the stream protocol cannot be asked: a read with brokerOutageTimeout=OUTAGE fails within it, naming the stream,
# the offsets and the port (an availableNow run once ended "successfully" with 0 of 2,000 rows, and a batch read with a
# bare AssertionError).
OUTAGE = 6


def _unreachable(node: Node, stream: str, **extra: str) -> dict[str, str]:
    return _over_amqp(node, stream, streamPort="1", brokerOutageTimeout=f"{OUTAGE}s", **extra)  # nothing listens on 1


def test_offsets_that_cannot_be_checked_fail_the_read_within_broker_outage_timeout(stream_node: Node, stream: str) -> None:
    publish(stream_node[2], stream, 0, 100)
    _compressed(stream_node, stream, 100, 100)
    publish(stream_node[2], stream, 200, 100)
    started = time.monotonic()
    with pytest.raises(AmqpSourceError) as raised:
        _read(_unreachable(stream_node, stream))
    took = time.monotonic() - started
    error = str(raised.value)
    # 3.10 closes the connection at offset 0, as its read-ahead reached the compressed chunk
    offsets = "0 to 299" if stream_node[0] == "3.10" else "100 to 199"
    assert f"stream '{stream}': offsets {offsets} did not come over AMQP 0-9-1" in error, error
    assert "127.0.0.1:1" in error and "option 'streamPort'" in error and f"brokerOutageTimeout={OUTAGE}s" in error, error
    # the check waits out the port for the deadline, never past it (the rest: planning, reading, the machine's load)
    assert OUTAGE <= took < OUTAGE + 15, took


def test_without_the_stream_protocol_failondataloss_false_reads_on_with_a_warning(
    stream_node: Node, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    publish(stream_node[2], stream, 0, 100)
    _compressed(stream_node, stream, 100, 100)
    publish(stream_node[2], stream, 200, 100)
    if stream_node[0] == "3.10":  # 3.10 refuses the read outright (541)
        pytest.skip("3.10 closes the connection at the compressed chunk: covered above")
    rows = _read(_unreachable(stream_node, stream, failOnDataLoss="false"))
    assert [i for i, _ in rows][99:101] == [99, 200]
    assert "could not be asked over the stream protocol at 127.0.0.1:1" in caplog.text and "failOnDataLoss=false" in caplog.text


def test_a_stream_of_compressed_sub_entries_that_cannot_be_checked_is_not_read_as_empty(
    stream_node: Node, stream: str, planners: list[StreamPlanner]
) -> None:
    _compressed(stream_node, stream, 0, 2000)
    counted(stream_node[2], stream, 1)
    for reading in ({}, {"failOnDataLoss": "false"}):  # the end of a stream is never guessed
        started = time.monotonic()
        with pytest.raises(AmqpSourceError, match=rf"stream '{stream}': the messages of its last chunk .*127\.0\.0\.1:1.*'streamPort'"):
            _read(_unreachable(stream_node, stream, **reading))  # spark.read plans its bounds
        assert time.monotonic() - started < OUTAGE + 15
    planner = StreamPlanner(parse_stream_options(_unreachable(stream_node, stream, startingOffsets="first")))
    planners.append(planner)
    with pytest.raises(AmqpSourceError, match=rf"stream '{stream}'.*127\.0\.0\.1:1.*'streamPort'"):
        planner.prepare_available_now()  # an availableNow run: its end is planned first


def test_a_running_query_that_cannot_check_its_streams_end_fails_within_broker_outage_timeout(
    stream_node: Node, stream: str, planners: list[StreamPlanner]
) -> None:
    publish(stream_node[2], stream, 0, 100)
    planner = StreamPlanner(parse_stream_options(_unreachable(stream_node, stream, startingOffsets="first")))
    planners.append(planner)
    start = planner.initial_offset()
    assert planner.latest_offset(start.to_json(), None, True).get(stream) == 100
    _compressed(stream_node, stream, 100, 500)  # now its end is compressed, and only the stream protocol tells
    failed: list[BaseException] = []

    def plans_until_it_fails() -> bool:
        try:
            planner.latest_offset(start.to_json(), None, True)
        except AmqpSourceError as err:
            failed.append(err)
        return bool(failed)

    began = time.monotonic()
    assert wait_for(plans_until_it_fails, timeout=REMEASURE + OUTAGE + 30, interval=0.05)
    error = str(failed[0])
    assert f"stream '{stream}': the messages of its last chunk" in error and "127.0.0.1:1" in error, error
    assert f"brokerOutageTimeout={OUTAGE}s" in error and "no answer from" not in error, error  # the broker did answer
    # measured again at the latest REMEASURE after the write; then waited out for the deadline, as an outage
    assert time.monotonic() - began < REMEASURE + OUTAGE + 15


def test_stream_port_is_for_amqp_uris() -> None:
    with pytest.raises(AmqpOptionError, match="option 'streamPort' is for amqp:// and amqps:// uris"):
        parse_stream_options({"uri": "rabbitmq-stream://u@h/v", "stream": "s", "streamPort": "5552"})
    assert parse_stream_options({"uri": "amqp://u@h/v", "stream": "s", "streamPort": "5560"}).connection.stream_port == 5560
