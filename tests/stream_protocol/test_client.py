"""``StreamClient`` against RabbitMQ's own stream protocol (3.10, 4.0, 4.3): each answer as the broker gives it.

Where the lines differ, the test says what each does: 3.10 has no ``stream_stats`` (it closes
the connection: unknown frame); 4.0 reports chunk ids only, 4.3 also ``committed_offset``.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import pika
import pytest

from spark_amqp import amqp10
from spark_amqp.errors import AmqpProtocolError, ConnectionLost, HandshakeFailed, StreamResponseError, is_transient
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.wire import Key
from tests.brokers import version_of

from .conftest import stream_options
from .helpers import publish, run, until

Node = tuple[str, str, str]


async def read(client: StreamClient, stream: str, offset: tuple[int, int], want: int, sub: int = 1) -> list[tuple[int, bytes]]:
    """(offset, record) of the first ``want`` messages the subscription delivers."""
    got: list[tuple[int, bytes]] = []

    def on_chunk(view: memoryview) -> None:
        header = chunks.read_header(view)
        got.extend((header.first_offset + i, r) for i, r in enumerate(chunks.records(view, header)))
        client.credit(sub, 1)

    await client.subscribe(sub, stream, offset, 1, on_chunk)
    await until(lambda: len(got) >= want)
    await client.unsubscribe(sub)
    return got


def test_the_handshake_reports_the_brokers_version(stream_node: Node) -> None:
    _name, url, amqp = stream_node
    version = run(url, lambda c: asyncio.sleep(0, c.server_version))
    assert version == version_of(amqp)


def test_a_wrong_password_is_an_authentication_failure_not_worth_a_retry(stream_node: Node) -> None:
    with pytest.raises(StreamResponseError, match="authentication failure") as caught:
        run(stream_node[1], lambda c: asyncio.sleep(0), password="wrong")
    assert caught.value.code == 0x08 and not is_transient(caught.value)


def test_an_unknown_vhost_is_refused_naming_it(stream_node: Node) -> None:
    url = stream_node[1].rsplit("/", 1)[0] + "/no-such-vhost"
    with pytest.raises(StreamResponseError, match="vhost 'no-such-vhost': virtual host access failure"):
        run(url, lambda c: asyncio.sleep(0))


def test_the_amqp_port_is_told_apart_from_the_stream_port(stream_node: Node) -> None:
    amqp_port = stream_node[2].rsplit(":", 1)[1].split("/")[0]
    url = stream_node[1].replace(stream_node[1].rsplit(":", 1)[1].split("/")[0], amqp_port)
    with pytest.raises((HandshakeFailed, ConnectionLost), match=r"does not speak the stream protocol|socket closed"):
        run(url, lambda c: asyncio.sleep(0))


def test_unsubscribing_a_subscription_the_broker_already_ended_is_not_an_error(stream_node: Node, stream_name: str) -> None:
    """In a failover RabbitMQ ends a subscription before the metadata update saying so arrives; unsubscribing it
    then gets 0x04, which failed the planner's latestOffset and the query (CI's failover test, once)."""

    async def body(c: StreamClient) -> list[int]:
        await c.create(stream_name)
        try:
            await c.subscribe(3, stream_name, OffsetSpec.NEXT, 1, lambda _: None)
            await c.request(Key.UNSUBSCRIBE, struct.pack(">B", 3), "subscription 3")  # ended behind the client's back
            assert 3 in c.subscriptions
            await c.unsubscribe(3)
            with pytest.raises(StreamResponseError, match=r"subscription id does not exist \(0x04\)"):
                await c.request(Key.UNSUBSCRIBE, struct.pack(">B", 3), "subscription 3")  # what the broker answers
            return list(c.subscriptions)
        finally:
            await c.delete(stream_name)

    assert run(stream_node[1], body) == []


def test_create_delete_and_metadata(stream_node: Node, stream_name: str) -> None:
    port = int(stream_node[1].rsplit(":", 1)[1].split("/")[0])

    async def body(c: StreamClient) -> None:
        await c.create(stream_name, {"max-segment-size-bytes": "1000000"})
        with pytest.raises(StreamResponseError, match="stream already exists"):
            await c.create(stream_name)
        found = await c.metadata(stream_name, stream_name + "-missing")
        assert found[stream_name][0] == 0x01 and found[stream_name][1] is not None and found[stream_name][1][1] == port
        assert found[stream_name + "-missing"] == (0x02, None)
        await c.delete(stream_name)
        with pytest.raises(StreamResponseError, match="stream does not exist") as caught:
            await c.delete(stream_name)
        assert caught.value.code == 0x02

    run(stream_node[1], body)


def test_deduplication_drops_ids_not_above_the_last_and_still_confirms_them(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            assert await c.publisher_sequence("job-1", stream_name) == 0
            assert await publish(c, stream_name, [b"a%d" % i for i in range(1, 11)], "job-1") == list(range(1, 11))
            # A retried task publishing 5..12 again: 5..10 are confirmed but not stored.
            assert sorted(await publish(c, stream_name, [b"b%d" % i for i in range(5, 13)], "job-1", first_id=5)) == list(range(5, 13))
            assert await c.publisher_sequence("job-1", stream_name) == 12
            assert await c.publisher_sequence("job-2", stream_name) == 0
            # Without a name nothing is deduplicated.
            await publish(c, stream_name, [b"c1"], "", first_id=1)
            got = [r for _, r in await read(c, stream_name, OffsetSpec.FIRST, 13)]
            assert got == [b"a%d" % i for i in range(1, 11)] + [b"b11", b"b12", b"c1"]
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_subscribe_with_each_offset_specification(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            for i in range(5):  # one confirmed publish at a time: a chunk each
                await publish(c, stream_name, [b"m%d" % i])
            before = int(time.time() * 1000)
            assert [o for o, _ in await read(c, stream_name, OffsetSpec.FIRST, 5)] == [0, 1, 2, 3, 4]
            assert [o for o, _ in await read(c, stream_name, OffsetSpec.offset(3), 2, sub=2)] == [3, 4]
            assert [o for o, _ in await read(c, stream_name, OffsetSpec.LAST, 1, sub=3)] == [4]
            assert next(o for o, _ in await read(c, stream_name, OffsetSpec.timestamp(before - 60_000), 5, sub=4)) == 0
            nexts: list[int] = []

            def on_next(view: memoryview) -> None:
                nexts.append(chunks.read_header(view).first_offset)

            await c.subscribe(5, stream_name, OffsetSpec.NEXT, 5, on_next)
            await publish(c, stream_name, [b"late"])
            await until(lambda: nexts == [5])
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_credit_gates_chunks_one_by_one(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        try:
            for i in range(4):
                await publish(c, stream_name, [b"m%d" % i])
            got: list[int] = []
            await c.subscribe(1, stream_name, OffsetSpec.FIRST, 1, lambda v: got.append(chunks.read_header(v).first_offset))
            await until(lambda: got == [0])
            await asyncio.sleep(0.3)  # what could arrive without credit has had time to
            assert got == [0]
            c.credit(1, 2)
            await until(lambda: got == [0, 1, 2])
        finally:
            await c.delete(stream_name)

    run(stream_node[1], body)


def test_stream_stats_by_version(stream_node: Node, stream_name: str) -> None:
    version = version_of(stream_node[2])

    async def body(c: StreamClient) -> Any:
        await c.create(stream_name)
        try:
            await publish(c, stream_name, [b"a", b"b", b"c"])
            await publish(c, stream_name, [b"d"])
            return await c.stats(stream_name)
        finally:
            if not c.closed.done():
                await c.delete(stream_name)

    if version < (3, 11):  # no stream_stats command yet: the broker closes the connection
        with pytest.raises(ConnectionLost, match="unknown frame"):
            run(stream_node[1], body)
        run(stream_node[1], lambda c: c.delete(stream_name))
        return
    stats = run(stream_node[1], body)
    assert stats["first_chunk_id"] == 0 and stats["committed_chunk_id"] == 3  # chunk ids: the chunks' first offsets
    if version >= (4, 3):
        assert stats["committed_offset"] == 3
    else:
        assert "committed_offset" not in stats


def test_partitions_of_a_super_stream(stream_node: Node, stream_name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))
    ch = conn.channel()
    ch.exchange_declare(stream_name, "direct", durable=True, arguments={"x-super-stream": True})
    for i in (2, 0, 1):
        ch.queue_declare(f"{stream_name}-{i}", durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(f"{stream_name}-{i}", stream_name, str(i), arguments={"x-stream-partition-order": i})
    try:
        if version_of(stream_node[2]) < (3, 11):
            # 3.10 never answers partitions of a missing super stream (its log shows the lookup failing): the
            # request's own timeout ends the wait, and the connection with it.
            with pytest.raises(ConnectionLost, match=r"super stream '.*-none': no answer from the broker within connectionTimeout=2s"):
                run(stream_node[1], lambda c: c.partitions(stream_name + "-none"), connectionTimeout="2")
            return
        found = run(stream_node[1], lambda c: c.partitions(stream_name))
        assert found == [f"{stream_name}-{i}" for i in range(3)]
        with pytest.raises(StreamResponseError, match="stream does not exist"):
            run(stream_node[1], lambda c: c.partitions(stream_name + "-none"))
    finally:
        for i in range(3):
            ch.queue_delete(f"{stream_name}-{i}")
        ch.exchange_delete(stream_name)
        conn.close()


def test_a_deleted_stream_is_announced_to_its_subscriber(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        updates: list[tuple[int, str]] = []
        c.on_metadata_update = lambda code, stream: updates.append((code, stream))
        await c.subscribe(1, stream_name, OffsetSpec.FIRST, 1, lambda v: None)
        other = await StreamClient.connect(stream_options(stream_node[1]), "spark-amqp test deleter")
        await other.delete(stream_name)
        await other.close()
        await until(lambda: updates == [(0x06, stream_name)])

    run(stream_node[1], body)


def test_an_amqp10_message_published_natively_reads_back_over_amqp091(stream_node: Node, stream_name: str) -> None:
    async def body(c: StreamClient) -> None:
        await c.create(stream_name)
        await publish(c, stream_name, [amqp10.encode(b"native", properties=["id-1"], application_properties={"k": "v"})])

    run(stream_node[1], body)
    conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        for method, props, got in ch.consume(stream_name, arguments={"x-stream-offset": "first"}, inactivity_timeout=20):
            assert method is not None
            assert (got, props.message_id, props.headers["k"]) == (b"native", "id-1", "v")
            break
        ch.queue_delete(stream_name)
    finally:
        conn.close()


def test_credit_for_an_unknown_subscription_ends_the_connection_with_the_brokers_code(stream_node: Node) -> None:
    async def body(c: StreamClient) -> AmqpProtocolError:
        c.credit(77, 1)
        return await asyncio.wait_for(c.closed, 20)

    reason = run(stream_node[1], body)
    assert isinstance(reason, StreamResponseError) and reason.code == 0x04
    assert "credit for subscription 77: subscription id does not exist" in str(reason)
