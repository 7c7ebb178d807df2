"""The trailer length in the chunk headers a subscription gets, on the embedded broker and on each RabbitMQ line.

osiris ends a chunk with a trailer: an entry for each writer with messages in the chunk (tracking type,
id size, id, the writer's 64-bit sequence), which deduplication reads back, so 10 bytes plus the id.
A stream-protocol producer with a name writes under that name, one without a name under none; an
AMQP 0-9-1 channel writes under an id of its own, its process id, ``_-`` and a GUID (22 characters).
A reader is sent the header, whose trailer length counts those entries, but not the trailer. 3.10,
4.0 and 4.3 all do this.
"""

from __future__ import annotations

import struct

import pika

from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.wire import Key, frame, string

from .helpers import publish, run, until

Node = tuple[str, str, str]
ENTRY = 10  # tracking type, id size, sequence


def publish_frame(pub_id: int, publishing_id: int, message: bytes) -> bytes:
    return frame(Key.PUBLISH, 1, struct.pack(">BiQI", pub_id, 1, publishing_id, len(message)) + message)


async def chunk_layout(client: StreamClient, stream: str, want: int) -> list[tuple[chunks.ChunkHeader, list[bytes], int]]:
    """(header, records, bytes after the data) of every chunk, until ``want`` messages came."""
    got: list[tuple[chunks.ChunkHeader, list[bytes], int]] = []

    def on_chunk(view: memoryview) -> None:
        header = chunks.read_header(view)
        got.append((header, chunks.records(view, header), len(view) - chunks.HEADER.size - header.data_length))
        client.credit(1, 1)

    await client.subscribe(1, stream, OffsetSpec.FIRST, 1, on_chunk)
    await until(lambda: sum(len(records) for _, records, _ in got) >= want)
    await client.unsubscribe(1)
    return got


def test_a_chunk_header_counts_an_entry_per_writer_in_its_trailer(stream_node: Node, stream_name: str) -> None:
    run(stream_node[1], lambda c: c.create(stream_name))
    try:
        conn = pika.BlockingConnection(pika.URLParameters(stream_node[2]))
        ch = conn.channel()
        ch.confirm_delivery()
        for body in (b"amqp-1", b"amqp-2"):  # offsets 0 and 1, from one channel
            ch.basic_publish("", stream_name, body)
        conn.close()
        writer = {b"x1": "producer-x", b"x2": "producer-x", b"n1": "", b"q1": "pq", b"q2": "pq"}
        writer |= {b"a1": "aa", b"a2": "aa", b"b1": "bbbb", b"u1": ""}

        async def body(c: StreamClient) -> list[tuple[chunks.ChunkHeader, list[bytes], int]]:
            await publish(c, stream_name, [b"x1", b"x2"], "producer-x")
            await publish(c, stream_name, [b"n1"])
            await publish(c, stream_name, [b"q1", b"q2"], "pq", 7)
            await publish(c, stream_name, [b"x1"], "producer-x")  # a duplicate: no chunk
            # Three producers in one write: one chunk, or a few if the broker cut it.
            confirmed: list[int] = []
            for pub, reference in ((1, "aa"), (2, "bbbb"), (3, "")):
                await c.declare_publisher(pub, reference, stream_name, confirmed.extend, print)
            c.write(publish_frame(1, 1, b"a1") + publish_frame(1, 2, b"a2") + publish_frame(2, 1, b"b1") + publish_frame(3, 1, b"u1"))
            await until(lambda: len(confirmed) == 4)
            return await chunk_layout(c, stream_name, 11)

        layout = run(stream_node[1], body)
        assert [after for _, _, after in layout] == [0] * len(layout)  # the trailer is not sent
        amqp = [header.trailer_length for header, _, _ in layout if header.first_offset < 2]
        # 10 + '<0.N.0>_-' + 22: 44 on a node whose channel pids have 4 digits (the embedded broker's)
        assert len(set(amqp)) == 1 and ENTRY + 8 + 3 + 22 <= amqp[0] <= ENTRY + 8 + 7 + 22, amqp
        for header, records, _ in layout:
            if header.first_offset >= 2:
                named = {writer[r] for r in records} - {""}
                assert header.trailer_length == sum(ENTRY + len(name) for name in named), (header, records)
        assert sum(len(records) for _, records, _ in layout) == 11
    finally:
        run(stream_node[1], lambda c: c.delete(stream_name))


def test_a_stored_offset_that_comes_with_messages_goes_in_their_chunks_trailer(stream_node: Node, stream_name: str) -> None:
    """osiris writes tracking with its writer's batch: a store_offset that comes with messages is an entry
    (10 bytes and the reference) in the trailer of their chunk, and takes no offset; one that comes alone is
    a tracking chunk, which takes an offset (see test_answers' test_stored_offsets_take_an_offset_of_the_stream)."""

    async def body(c: StreamClient) -> list[tuple[int, int, int]]:
        await c.create(stream_name)
        try:
            confirmed: list[int] = []
            await c.declare_publisher(1, "w", stream_name, confirmed.extend, print)
            store = frame(Key.STORE_OFFSET, 1, string("reader-1") + string(stream_name) + struct.pack(">Q", 0))
            c.write(b"".join(store + publish_frame(1, i, b"m%d" % i) for i in range(1, 4)))  # in one write
            await until(lambda: len(confirmed) == 3)
            return [(h.first_offset, h.records, h.trailer_length) for h, _, _ in await chunk_layout(c, stream_name, 3)]
        finally:
            await c.delete(stream_name)

    layout = run(stream_node[1], body)
    writer, tracking = ENTRY + len("w"), ENTRY + len("reader-1")
    # [(0, 3, writer + tracking)]: one batch. A loaded broker may cut it, and write a store_offset that came
    # alone as a tracking chunk (a gap in the offsets), but never the stored offset's entry twice in a chunk.
    assert all(trailer in (writer, writer + tracking) for _, _, trailer in layout), layout
    if not any(trailer == writer + tracking for _, _, trailer in layout):
        # Every store_offset written alone (seen on a loaded 4.0): as tracking chunks, which take offsets no reader sees.
        ends = [first + records for first, records, _ in layout]
        assert layout[0][0] > 0 or any(nxt[0] > end for nxt, end in zip(layout[1:], ends[:-1], strict=True)), layout
    if len(layout) == 1:
        # Its first offset may be 1: a loaded RabbitMQ 4.0 was seen writing a tracking chunk first (offset 0).
        assert [(records, trailer) for _, records, trailer in layout] == [(3, writer + tracking)], layout
