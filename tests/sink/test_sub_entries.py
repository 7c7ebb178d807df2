"""The stream sink's sub-entries (options subEntrySize and compression), without Spark, on every stream broker:
every codec stored and read back, deduplicated per sub-entry, and the inputs that are refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from spark_amqp.errors import AmqpOptionError
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import Producer, producer_for
from spark_amqp.sink.publisher import PublishResult
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.sink.sub_entries import SubEntries, uncompressed_limit
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.compression import CODECS, SUB_ENTRY
from spark_amqp.stream_protocol.rows import Conversion, RowMaker

from .stream_helpers import create, delete, drop_after, records, run, until

Node = tuple[str, str, str]
N = 1_000


@pytest.fixture
def stream(stream_node: Node, stream_name: str) -> Iterator[str]:
    create(stream_node[1], stream_name)
    yield stream_name
    delete(stream_node[1], stream_name)


def _publish(url: str, table: dict[str, list[Any]], producer: Producer | None = None, **options: str) -> PublishResult:
    opts = parse_sink_options({"uri": url, "connectionTimeout": "20", **options})
    batch = pa.RecordBatch.from_pydict(table)
    return asyncio.run(StreamPartitionPublisher(opts, producer or producer_for("test-" + uuid.uuid4().hex, 0, None)).publish([batch]))


def _bodies(url: str, stream: str) -> list[bytes]:
    maker = RowMaker(stream, Conversion.of(None))
    return [maker.row(r, i)[0] for i, r in enumerate(records(url, stream))]


def _entry_kinds(url: str, stream: str) -> list[int]:
    """The header byte of every entry of the stream's chunks (0 for a simple entry): how it was stored."""

    async def body(c: StreamClient) -> list[int]:
        kinds: list[int] = []
        seen: list[int] = []

        def on_chunk(view: memoryview) -> None:
            header = chunks.read_header(view)
            data = bytes(view[chunks.HEADER.size : chunks.HEADER.size + header.data_length])
            pos = 0
            for _ in range(header.entries):
                if data[pos] & 0x80:
                    kinds.append(data[pos])
                    pos += SUB_ENTRY.size + SUB_ENTRY.unpack_from(data, pos)[3]
                else:
                    kinds.append(0)
                    pos += 4 + int.from_bytes(data[pos : pos + 4], "big")
            seen.append(header.next_offset)
            c.credit(1, 1)

        await c.subscribe(1, stream, OffsetSpec.FIRST, 2, on_chunk)
        await until(lambda: bool(seen) and seen[-1] >= N)
        await c.unsubscribe(1)
        return kinds

    return run(url, body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("codec", list(CODECS.values()))
def test_every_codec_is_stored_as_sub_entries_and_read_back_in_order(stream_node: Node, stream: str, codec: str) -> None:
    bodies = [b"m%d-" % i + b"x" * (i % 300) for i in range(N)]
    done = _publish(stream_node[1], {"body": bodies}, stream=stream, subEntrySize="100", compression=codec, maxInFlight="300")
    assert (done.published, done.confirmed) == (N, N)
    assert _bodies(stream_node[1], stream) == bodies
    kinds = _entry_kinds(stream_node[1], stream)
    assert kinds[: N // 100] == [0x80 | list(CODECS.values()).index(codec) << 4] * (N // 100)  # ten sub-entries of 100, as written
    assert set(kinds[N // 100 :]) <= {0}  # after them, the plain marker _bodies wrote


def test_a_retried_partition_is_stored_once_sub_entry_by_sub_entry(stream_node: Node, stream: str) -> None:
    producer = producer_for("query-" + uuid.uuid4().hex, 0, 3)
    table = {"body": [b"r%d" % i for i in range(250)]}  # two full sub-entries and one of 50
    for _ in range(2):  # the task retried: the same rows, the same sub-entries under the same ids
        done = _publish(stream_node[1], table, producer, stream=stream, subEntrySize="100", compression="zstd")
        assert done.confirmed == 250
    assert _bodies(stream_node[1], stream) == table["body"]


def test_filter_values_cannot_go_into_sub_entries_and_nothing_is_published(stream_node: Node, stream: str) -> None:
    table = {"body": [b"a", b"b"], "filter_value": [None, "eu"]}
    with pytest.raises(AmqpOptionError, match=r"column 'filter_value', row 1 .*subEntrySize.*nothing of this partition was published"):
        _publish(stream_node[1], table, stream=stream, subEntrySize="10", compression="gzip")
    assert _bodies(stream_node[1], stream) == []


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"compression": "zstd"}, r"option 'compression' \(zstd\) compresses sub-entries.*'subEntrySize'"),
        ({"compression": "brotli", "subEntrySize": "10"}, "option 'compression' must be one of none, gzip, snappy, lz4, zstd"),
        ({"subEntrySize": "0"}, "subEntrySize"),
        ({"subEntrySize": "65536"}, "subEntrySize"),
    ],
)
def test_bad_sub_entry_options_name_the_option(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(AmqpOptionError, match=fragment):
        parse_sink_options({"uri": "rabbitmq-stream://u@h/v", "stream": "s", **options})


@pytest.mark.parametrize("key", ["subEntrySize", "compression"])
def test_sub_entry_options_need_a_stream_uri(key: str) -> None:
    with pytest.raises(AmqpOptionError, match=f"option '{key}' needs a rabbitmq-stream:// uri"):
        parse_sink_options({"uri": "amqp://u@h/v", "routingKey": "q", key: "2"})


def test_sub_entry_options_parse() -> None:
    opts = parse_sink_options({"uri": "rabbitmq-stream://u@h/v", "stream": "s", "subEntrySize": "50", "compression": "LZ4"})
    assert (opts.sub_entry_size, opts.compression) == (50, "lz4")
    plain = parse_sink_options({"uri": "rabbitmq-stream://u@h/v", "stream": "s"})
    assert (plain.sub_entry_size, plain.compression) == (1, "none")


def _messages(sizes: list[int], target: int = 0) -> list[Any]:
    from spark_amqp.sink.stream_messages import StreamMessage

    return [StreamMessage(target, i, None, b"x" * size) for i, size in enumerate(sizes)]


def test_sub_entries_are_cut_by_count_and_size_alone_and_carry_their_last_id() -> None:
    frame_max = 1 << 20
    limit = uncompressed_limit(frame_max)
    groups = SubEntries(3, "snappy", frame_max)
    big = limit // 2  # two fit (with their sizes), a third does not
    out = [groups.add(m) for m in _messages([10, 10, 10, 10, big, big, 10])]
    done = [m for m in out if m is not None]
    assert [(m.publishing_id, m.messages) for m in done] == [
        (2, 3),
        (4, 2),
    ]  # full at 3; then closed before the big one that no longer fits
    last = groups.next_open()
    assert last is not None and (last.publishing_id, last.messages) == (6, 2) and groups.next_open() is None
    assert all(m.sub_entry and len(m.record) <= frame_max - 21 for m in [*done, last])


def test_incompressible_sub_entries_still_fit_a_frame() -> None:
    import os

    frame_max = 131_072
    groups = SubEntries(1000, "lz4", frame_max)
    out = [groups.add(m) for m in [m._replace(record=os.urandom(len(m.record))) for m in _messages([4000] * 100)]]
    done = [m for m in [*out, groups.next_open()] if m is not None]
    assert sum(m.messages for m in done) == 100
    assert all(len(m.record) <= frame_max - 21 for m in done)


def test_a_dropped_connection_publishes_the_unconfirmed_sub_entries_again_and_stores_every_row_once(
    stream_node: Node, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spark_amqp.transport.backoff.FIRST", 0.01)
    dropped = drop_after(monkeypatch, 1500)
    bodies = [b"d%d" % i for i in range(5000)]
    done = _publish(stream_node[1], {"body": bodies}, stream=stream, subEntrySize="100", compression="lz4", maxInFlight="1000")
    assert dropped and (done.published, done.confirmed) == (5000, 5000)
    assert _bodies(stream_node[1], stream) == bodies


def test_a_task_retried_after_failing_mid_partition_stores_every_row_once(
    stream_node: Node, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_amqp.errors import AmqpPublishError

    monkeypatch.setattr(StreamPartitionPublisher, "_may_retry", lambda *_: False)  # no reconnect in the task: Spark retries it
    producer = producer_for("query-" + uuid.uuid4().hex, 1, 0)
    table = {"body": [b"t%d" % i for i in range(3000)]}
    with monkeypatch.context() as patch:
        drop_after(patch, 1200)
        with pytest.raises(AmqpPublishError, match="not confirmed"):
            _publish(stream_node[1], table, producer, stream=stream, subEntrySize="50", compression="snappy", maxInFlight="600")
    assert 1200 <= len(_bodies(stream_node[1], stream)) < 3000
    _publish(stream_node[1], table, producer, stream=stream, subEntrySize="50", compression="snappy")  # the retry
    assert _bodies(stream_node[1], stream) == table["body"]
