"""What each broker does with sub-entries, the embedded broker checked against RabbitMQ 3.10, 4.0 and 4.3 by the same
tests: stored whole (one entry, its records counted), their records' offsets, what an AMQP 0-9-1 consumer gets of
them, and the 64 MiB limit."""

from __future__ import annotations

import time

import pika
import pika.exceptions

from spark_amqp import amqp10
from spark_amqp.stream_protocol import chunks, compression
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from tests.brokers import version_of

from .helpers import run, until

Node = tuple[str, str, str]
PRECONDITION_FAILED = 0x11


def _message(i: int) -> bytes:
    return amqp10.encode(b"m%d" % i, properties=[f"m{i}"])


async def _publish_entries(c: StreamClient, stream: str, entries: list[tuple[int, bytes | list[bytes]]]) -> list[tuple[int, int]]:
    """Publish simple messages (bytes) and sub-entries (a list: zstd-compressed), one frame each; the errors."""
    confirmed: list[int] = []
    errors: list[tuple[int, int]] = []
    await c.declare_publisher(3, "", stream, confirmed.extend, errors.extend)
    for pid, entry in entries:
        if isinstance(entry, list):
            c.publish_sub_entries(3, [(pid, compression.encode(4, entry))])
        else:
            c.publish(3, [(pid, entry)])
        answered = len(confirmed) + len(errors)
        await until(lambda: len(confirmed) + len(errors) > answered)  # noqa: B023 (waited on at once)
    await c.delete_publisher(3)
    return errors


def test_a_sub_entry_is_stored_whole_and_its_records_take_an_offset_each(stream_node: Node, created_stream: str) -> None:
    async def body(c: StreamClient) -> list[tuple[int, int, int | None]]:
        assert await _publish_entries(c, created_stream, [(1, [_message(i) for i in range(5)]), (2, _message(5))]) == []
        got: list[bytes] = []

        def on_chunk(view: memoryview) -> None:
            got.append(bytes(view))
            c.credit(1, 1)

        await c.subscribe(1, created_stream, OffsetSpec.FIRST, 5, on_chunk)
        spans: list[tuple[int, int, int | None]] = []
        await until(lambda: sum(chunks.read_header(g).records for g in got) >= 6)
        for data in got:
            spans += chunks.entry_spans(data, chunks.read_header(data))
        await c.unsubscribe(1)
        return spans

    assert run(stream_node[1], body) == [(0, 5, 4), (5, 1, None)]  # one zstd sub-entry of offsets 0-4, then offset 5


def test_an_amqp_091_consumer_gets_no_compressed_record(stream_node: Node, created_stream: str) -> None:
    entries: list[tuple[int, bytes | list[bytes]]] = [(1, _message(0)), (2, [_message(i) for i in range(1, 4)]), (3, _message(4))]
    assert run(stream_node[1], lambda c: _publish_entries(c, created_stream, entries)) == []
    conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))
    got: list[int] = []
    closed: list[str] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        ch.basic_consume(
            created_stream, lambda ch, m, p, b: got.append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": "first"}
        )
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        # 4.x: nothing more comes after offset 4 (the compressed records are skipped); watched for a while.
        quiet = time.monotonic() + 0.5
        while time.monotonic() < quiet:
            conn.process_data_events(0.1)
    except pika.exceptions.AMQPConnectionError as err:
        closed.append(repr(err))
    finally:
        if conn.is_open:
            conn.close()
    if version_of(stream_node[2]) < (4, 0):
        assert closed and "541" in closed[0] and 4 not in got  # 3.10 closes the connection at the chunk
    else:
        assert got == [0, 4] and not closed  # 4.x and the embedded broker: offsets 1-3 never come, no error


def test_over_64_mib_declared_is_refused_by_4_3_and_the_embedded_broker(stream_node: Node, created_stream: str) -> None:
    entry = bytearray(compression.encode(4, [_message(0)]))
    entry[3:7] = (compression.MAX_UNCOMPRESSED + 1).to_bytes(4, "big")

    async def body(c: StreamClient) -> list[tuple[int, int]]:
        confirmed: list[int] = []
        errors: list[tuple[int, int]] = []
        await c.declare_publisher(3, "", created_stream, confirmed.extend, errors.extend)
        c.publish_sub_entries(3, [(1, bytes(entry))])
        await until(lambda: bool(confirmed or errors))
        return errors

    errors = run(stream_node[1], body)
    if version_of(stream_node[2]) >= (4, 3):
        assert errors == [(1, PRECONDITION_FAILED)]
    else:
        assert errors == []  # 3.10 and 4.0 store it; a reader refuses it (test_compression)
