"""What each stream-protocol command answers, on the embedded broker and on each RabbitMQ line.

These pin the answers the embedded broker models (RabbitMQ 4.3) against the real nodes:
response codes and the order of checks, deduplication across connections, offsets taken
by tracking chunks, credit, filters, and what a deleted stream does to its publishers and
subscribers. Where the lines differ, the test says what each does.
"""

from __future__ import annotations

import asyncio
import struct
import time

import pika
import pytest

from spark_amqp import amqp10
from spark_amqp.errors import ConnectionLost, StreamResponseError
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.wire import Key, frame, map_, string, strings
from tests.brokers import version_of

from .helpers import publish, run, until

Node = tuple[str, str, str]


async def unsubscribe(c: StreamClient, sub: int) -> object:
    """The broker's own answer to unsubscribe (``StreamClient.unsubscribe`` takes 0x04 as done)."""
    return await c.request(Key.UNSUBSCRIBE, struct.pack(">B", sub), f"subscription {sub}")


async def code(request: object) -> int:
    """The response code a request gets (0x01 for OK)."""
    try:
        await request  # type: ignore[misc]
    except StreamResponseError as err:
        return err.code
    return 0x01


async def offsets(
    client: StreamClient, stream: str, offset: tuple[int, int], sub: int, props: dict[str, str] | None = None, last: int | None = None
) -> list[list[int]]:
    """The offsets of each chunk a subscription gets until 0.3 s pass without one (credit for all), once the
    chunk holding offset ``last`` (if given) has come: a loaded machine can be slower than 0.3 s."""
    got: list[list[int]] = []
    seen = [time.monotonic()]

    def on_chunk(view: memoryview) -> None:
        header = chunks.read_header(view)
        got.append(list(range(header.first_offset, header.next_offset)))
        seen[0] = time.monotonic()
        client.credit(sub, 1)

    await client.subscribe(sub, stream, offset, 1, on_chunk, props)
    if last is not None:
        await until(lambda: any(last in chunk for chunk in got))
    await until(lambda: time.monotonic() - seen[0] > 0.3)
    await client.unsubscribe(sub)
    return got


def test_checks_and_their_codes(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name, {"max-age": "1h"})
        try:
            assert await code(c.create(stream_name, {"max-age": "1h"})) == 0x05  # the same again: already exists
            assert await code(c.create(stream_name, {"max-age": "2h"})) == 0x11  # other arguments: precondition failed
            for refused in ({"initial-cluster-size": "0"}, {"queue-leader-locator": "nowhere"}):
                assert await code(c.create(stream_name + "-x", refused)) == 0x11
            assert await code(c.create("amq.reserved")) == 0x11
            assert await code(c.subscribe(1, stream_name + "-none", OffsetSpec.FIRST, 1, lambda v: None)) == 0x02
            await c.subscribe(1, stream_name, OffsetSpec.FIRST, 1, lambda v: None)
            assert await code(c.subscribe(1, stream_name, OffsetSpec.FIRST, 1, lambda v: None)) == 0x03
            assert await code(unsubscribe(c, 2)) == 0x04
            await c.unsubscribe(1)
            noop = print
            assert await code(c.declare_publisher(1, "", stream_name + "-none", noop, noop)) == 0x02
            await c.declare_publisher(1, "ref", stream_name, noop, noop)
            assert await code(c.declare_publisher(1, "", stream_name, noop, noop)) == 0x11  # the id is taken
            assert await code(c.declare_publisher(2, "ref", stream_name, noop, noop)) == 0x11  # so is the reference
            assert await code(c.declare_publisher(1, "", stream_name + "-none", noop, noop)) == 0x11  # the id, before the stream
            await c.delete_publisher(1)
            assert await code(c.delete_publisher(1)) == 0x12
            assert await code(c.publisher_sequence("ref", stream_name + "-none")) == 0x02
            assert await code(c.delete(stream_name + "-none")) == 0x02
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_deduplication_holds_across_connections(stream_node: Node, stream_name: str) -> None:
    run(stream_node[1], lambda c: c.create(stream_name))
    try:
        assert run(stream_node[1], lambda c: publish(c, stream_name, [b"a%d" % i for i in range(1, 6)], "job")) == [1, 2, 3, 4, 5]
        # A task retried on another connection publishes 3..7 again: all confirmed, 6 and 7 stored.
        assert sorted(run(stream_node[1], lambda c: publish(c, stream_name, [b"b%d" % i for i in range(3, 8)], "job", 3))) == [
            3,
            4,
            5,
            6,
            7,
        ]

        async def check(c: StreamClient) -> None:
            assert await c.publisher_sequence("job", stream_name) == 7
            assert await c.publisher_sequence("other", stream_name) == 0
            got = await offsets(c, stream_name, OffsetSpec.FIRST, 1)
            assert sum(len(o) for o in got) == 7

        run(stream_node[1], check)
    finally:
        run(stream_node[1], lambda c: c.delete(stream_name))


def test_subscriptions_start_where_their_offset_specification_says(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            await publish(c, stream_name, [b"a", b"b"])  # one chunk: 0, 1
            await asyncio.sleep(0.05)
            between = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            await publish(c, stream_name, [b"c"])  # 2
            every = await offsets(c, stream_name, OffsetSpec.FIRST, 6)  # [[0, 1], [2]], unless the broker cut a chunk after 0
            holding = next(i for i, chunk in enumerate(every) if 1 in chunk)
            assert await offsets(c, stream_name, OffsetSpec.offset(1), 1) == every[holding:]  # from the chunk that holds it, whole
            assert await offsets(c, stream_name, OffsetSpec.timestamp(between), 2) == [[2]]
            assert await offsets(c, stream_name, OffsetSpec.timestamp(between + 3_600_000), 3) == []
            assert await offsets(c, stream_name, OffsetSpec.LAST, 4) == [[2]]
            past: list[int] = []

            def on_chunk(view: memoryview) -> None:
                past.append(chunks.read_header(view).first_offset)

            await c.subscribe(5, stream_name, OffsetSpec.offset(1000), 5, on_chunk)  # past the end: the next chunk
            await publish(c, stream_name, [b"d"])
            await until(lambda: past == [3])
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_credit_below_half_the_initial_credit_sends_nothing(stream_node: Node, stream_name: str) -> None:
    """4.x sends nothing while a subscription's credit is at most half its initial credit; 3.10 sends at once."""
    waits = version_of(stream_node[2]) >= (4, 0)

    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            for i in range(4):
                await publish(c, stream_name, [b"m%d" % i])
            got: list[int] = []
            await c.subscribe(1, stream_name, OffsetSpec.FIRST, 2, lambda v: got.append(chunks.read_header(v).first_offset))
            await until(lambda: got == [0, 1])
            c.credit(1, 1)  # credit 1, not above 2 // 2: nothing yet on 4.x
            if waits:
                # A window in which nothing may come: 4.x sends chunk 2 only with the next credit, below.
                await asyncio.sleep(0.3)
                assert got == [0, 1]
            else:
                await until(lambda: got == [0, 1, 2])
            c.credit(1, 1)
            await until(lambda: got == [0, 1, 2, 3])
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_stored_offsets_take_an_offset_of_the_stream(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            query = (Key.QUERY_OFFSET, string("reader") + string(stream_name), "query offset")
            assert await code(c.request(*query)) == 0x13  # none stored yet
            await publish(c, stream_name, [b"a", b"b"])
            c.write(frame(Key.STORE_OFFSET, 1, string("reader") + string(stream_name) + struct.pack(">Q", 1)))
            # store_offset has no answer: the stored offset shows once its tracking chunk is written.
            deadline = time.monotonic() + 20
            while await code(c.request(*query)) != 0x01:
                assert time.monotonic() < deadline, "the stored offset never showed"
                await asyncio.sleep(0.01)
            assert (await c.request(*query)).u64() == 1
            await publish(c, stream_name, [b"c"])
            # The tracking chunk took offset 2: the next message is at 3.
            assert [o for chunk in await offsets(c, stream_name, OffsetSpec.FIRST, 1) for o in chunk] == [0, 1, 3]
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_stream_stats_of_an_empty_stream(stream_node: Node, stream_name: str) -> None:
    version = version_of(stream_node[2])
    if version < (3, 11):
        pytest.skip("RabbitMQ 3.10 has no stream_stats (test_client covers what it does)")

    async def body(c: StreamClient) -> dict[str, int]:
        await c.create(stream_name)
        try:
            return await c.stats(stream_name)
        finally:
            await c.delete(stream_name)

    stats = run(stream_node[1], body)
    expected = {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}
    if version >= (4, 3):
        expected["committed_offset"] = -1
    assert stats == expected


def test_a_filtered_subscription_gets_the_chunks_whose_filter_may_hold_its_values(stream_node: Node, stream_name: str) -> None:
    if version_of(stream_node[2]) < (3, 13):
        pytest.skip("filtering came with RabbitMQ 3.13")

    def publish_v2(c: StreamClient, items: list[tuple[int, str | None, bytes]]) -> None:
        body = b"".join(struct.pack(">Q", i) + string(v) + struct.pack(">I", len(m)) + m for i, v, m in items)
        c.write(frame(Key.PUBLISH, 2, struct.pack(">Bi", 1, len(items)) + body))

    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            confirmed: list[int] = []
            await c.declare_publisher(1, "", stream_name, confirmed.extend, print)
            for n, items in enumerate(([(1, "eu", b"e1")], [(2, "us", b"u1")], [(3, None, b"n1")], [(4, "eu", b"e2"), (5, None, b"n2")])):
                publish_v2(c, items)  # a chunk each
                await until(lambda n=n: len(confirmed) >= [1, 2, 3, 5][n])
            # The last frame's two messages share a chunk, unless the broker (loaded) wrote the first alone:
            # then the message without a value is not sent with it. What comes is whole chunks all the same.
            layout = await offsets(c, stream_name, OffsetSpec.FIRST, 5, last=4)
            assert layout in ([[0], [1], [2], [3, 4]], [[0], [1], [2], [3], [4]]), layout
            values = ["eu", "us", None, "eu", None]

            def chunks_for(wanted: set[str], unfiltered: bool) -> list[list[int]]:
                if not wanted:
                    return layout  # match-unfiltered without a filter value filters nothing
                return [ch for ch in layout if any(values[o] in wanted or (unfiltered and values[o] is None) for o in ch)]

            for sub, props, wanted, unfiltered in (
                (1, {"filter.0": "eu"}, {"eu"}, False),
                (2, {"filter.0": "eu", "match-unfiltered": "true"}, {"eu"}, True),
                (3, {"filter.a": "us", "filter.b": "eu"}, {"us", "eu"}, False),
                (4, {"match-unfiltered": "true"}, set(), True),
            ):
                expected = chunks_for(wanted, unfiltered)
                assert await offsets(c, stream_name, OffsetSpec.FIRST, sub, props, last=expected[-1][-1]) == expected, props
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_a_deleted_stream_ends_its_publishers_too(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        updates: list[tuple[int, str]] = []
        errors: list[tuple[int, int]] = []
        c.on_metadata_update = lambda code, stream: updates.append((code, stream))
        await c.declare_publisher(1, "", stream_name, print, errors.extend)
        await c.subscribe(1, stream_name, OffsetSpec.FIRST, 1, lambda v: None)
        conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))  # deleted over AMQP 0-9-1
        conn.channel().queue_delete(stream_name)
        conn.close()
        await until(lambda: updates == [(0x06, stream_name)])
        c.publish(1, [(1, b"late"), (2, b"later")])
        await until(lambda: errors == [(1, 0x12), (2, 0x12)])  # the publisher went with the stream
        assert await code(c.delete_publisher(1)) == 0x12
        assert await code(unsubscribe(c, 1)) == 0x04
        assert updates == [(0x06, stream_name)]  # one update for the stream

    run(stream_node[1], body)


def test_a_binary_record_closes_an_amqp091_readers_connection(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        await publish(c, stream_name, [amqp10.encode(b"fine"), b"\x01binary"])

    run(stream_node[1], body)
    conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))
    got: list[bytes] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _method, _props, body_ in ch.consume(stream_name, arguments={"x-stream-offset": "first"}, inactivity_timeout=20):
                got.append(body_)
        assert (closed.value.reply_code, closed.value.reply_text) == (541, "INTERNAL_ERROR")
    finally:
        if conn.is_open:
            conn.close()
        run(stream_node[1], lambda c: c.delete(stream_name))


def test_an_unknown_command_gets_a_close_request(stream_node: Node) -> None:
    async def body(c: StreamClient) -> object:
        c.write(struct.pack(">IHHI", 8, 0x7F, 1, 99))
        return await asyncio.wait_for(c.closed, 20)

    reason = run(stream_node[1], body)
    assert isinstance(reason, ConnectionLost) and "unknown frame (code 0x0d)" in str(reason)


def test_create_and_delete_a_super_stream(stream_node: Node, stream_name: str) -> None:
    if version_of(stream_node[2]) < (3, 13):
        pytest.skip("create_super_stream and delete_super_stream came with RabbitMQ 3.13")
    parts = [f"{stream_name}-0", f"{stream_name}-1"]

    def create(name: str, partitions: list[str], keys: list[str], arguments: dict[str, str]) -> tuple[int, str, str]:
        return (0x1D, string(name) + strings(partitions) + strings(keys) + map_(arguments), f"create super stream '{name}'")

    async def body(c: StreamClient) -> None:
        assert await code(c.request(*create(stream_name, parts, ["0", "1"], {}))) == 0x01
        try:
            assert await code(c.request(*create(stream_name, parts, ["0", "1"], {}))) == 0x05
            assert await c.partitions(stream_name) == parts
            assert (await c.request(Key.ROUTE, string("1") + string(stream_name), "route")).strings() == parts[1:]
            assert (await c.request(Key.ROUTE, string("9") + string(stream_name), "route")).strings() == []
            assert await code(c.request(*create(stream_name + "-x", ["a"], [], {}))) == 0x11  # a key for each partition
            # A partition's arguments refused: rolled back, and the answer is an internal error.
            assert await code(c.request(*create(stream_name + "-y", [stream_name + "-y-0"], ["0"], {"initial-cluster-size": "0"}))) == 0x0F
            assert await code(c.partitions(stream_name + "-y")) == 0x02
        finally:
            assert await code(c.request(0x1E, string(stream_name), "delete super stream")) == 0x01
        assert await code(c.request(0x1E, string(stream_name), "delete super stream")) == 0x02
        assert (await c.metadata(*parts)) == {p: (0x02, None) for p in parts}

    run(stream_node[1], body)


def test_resolve_offset_spec_names_the_chunk_a_reader_would_start_with(stream_node: Node, stream_name: str) -> None:
    if version_of(stream_node[2]) < (4, 3):
        pytest.skip("resolve_offset_spec came with RabbitMQ 4.3")

    async def resolve(c: StreamClient, stream: str, spec: bytes) -> tuple[int, int]:
        r = await c.request(0x1F, string(stream) + spec, "resolve offset spec")
        return r.u16(), r.u64()

    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            assert await resolve(c, stream_name, struct.pack(">H", 1)) == (4, 0)  # an empty stream: 0 for every spec
            assert await resolve(c, stream_name, struct.pack(">H", 3)) == (4, 0)
            await publish(c, stream_name, [b"a", b"b"])
            await publish(c, stream_name, [b"c"])
            every = await offsets(c, stream_name, OffsetSpec.FIRST, 1)
            assert await resolve(c, stream_name, struct.pack(">H", 2)) == (4, every[-1][0])  # last: the last chunk
            assert await resolve(c, stream_name, struct.pack(">H", 3)) == (4, 3)  # next
            holding = next(chunk[0] for chunk in every if 1 in chunk)
            assert await resolve(c, stream_name, struct.pack(">HQ", 4, 1)) == (4, holding)
            assert await resolve(c, stream_name, struct.pack(">HQ", 4, 100)) == (4, 3)
            assert await code(c.request(0x1F, string(stream_name + "-none") + struct.pack(">H", 1), "resolve")) == 0x02
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_a_frame_above_frame_max_gets_a_close_request(stream_node: Node) -> None:
    """4.3 enforces the frame_max both sides tuned to (1 MiB); 3.10 and 4.0 take the frame and carry on."""
    enforced = version_of(stream_node[2]) >= (4, 3)

    async def body(c: StreamClient) -> object:
        c.publish(1, [(1, b"x" * 1_100_000)])
        if not enforced:
            return await c.metadata("none")
        return await asyncio.wait_for(c.closed, 20)

    reason = run(stream_node[1], body)
    if enforced:
        assert isinstance(reason, ConnectionLost) and "frame too large (code 0x0e)" in str(reason)
    else:
        assert reason == {"none": (0x02, None)}
