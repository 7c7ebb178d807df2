"""The client's frame reader without a socket: every way deliveries can be cut into reads gives the same
deliveries, whether a delivery's frames arrive together (one call) or one by one; and a stream
offset is taken out of a content header without losing or inventing anything."""

from __future__ import annotations

import asyncio
import datetime
import random
import struct
from typing import Any

import pytest
from pamqp import commands, header

from spark_amqp import framing
from spark_amqp.client.channel import ClientChannel
from spark_amqp.client.connection import AmqpClient
from spark_amqp.client.properties import LazyProperties, decode_properties, find_header
from spark_amqp.queues.options import parse_source_options


def _deliver(channel: int, tag: int, routing_key: str, props: commands.Basic.Properties, body: bytes, frame_max: int) -> bytes:
    method = framing.frame(
        framing.FRAME_METHOD,
        channel,
        struct.pack(">HH", 60, 60)
        + framing.shortstr("ctag")
        + struct.pack(">Q", tag)
        + bytes((tag % 2,))
        + framing.shortstr("ex")
        + framing.shortstr(routing_key),
    )
    content = header.ContentHeader(0, len(body), props).marshal()
    return method + b"".join(framing.content_frames(channel, content, body, frame_max))


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False


def _client(channels: tuple[int, ...]) -> tuple[AmqpClient, dict[int, list[tuple[Any, ...]]]]:
    loop = asyncio.new_event_loop()
    options = parse_source_options({"uri": "amqp://guest:guest@127.0.0.1/%2F", "queue": "q"}).connection
    client = AmqpClient(loop, options, "test")
    client.transport = _Transport()  # type: ignore[assignment]
    client._opened.set_result(None)
    got: dict[int, list[tuple[Any, ...]]] = {}
    for number in channels:
        ch = ClientChannel(client, number)
        client.channels[number] = ch
        got[number] = []
        ch.on_delivery = lambda tag, red, ex, rk, props, body, n=number: got[n].append((tag, red, ex, rk, props.arrow_row(), body))
    return client, got


@pytest.mark.parametrize("seed", range(12))
def test_deliveries_are_the_same_however_the_reads_cut_the_frames(seed: int) -> None:
    rnd = random.Random(seed)
    frame_max = 4096
    wire: list[bytes] = []
    expected: dict[int, list[tuple[Any, ...]]] = {1: [], 2: []}
    for tag in range(1, 301):
        channel = rnd.choice((1, 2))
        # empty bodies, one frame, several frames; with and without properties
        body = bytes(rnd.getrandbits(8) for _ in range(rnd.choice((0, 1, 200, 4088, 4089, 9000))))
        props = commands.Basic.Properties(message_id=f"m{tag}", headers={"n": tag}) if tag % 3 else commands.Basic.Properties()
        wire.append(_deliver(channel, tag, f"rk{tag}", props, body, frame_max))
        content = header.ContentHeader(0, len(body), props).marshal()
        expected[channel].append((tag, bool(tag % 2), "ex", f"rk{tag}", LazyProperties(content).arrow_row(), body))
    data = b"".join(wire)
    client, got = _client((1, 2))
    at = 0
    while at < len(data):
        step = rnd.choice((1, 7, 100, 5000, 65536))
        client.data_received(data[at : at + step])
        at += step
    assert not client.closed.done()
    assert got == expected


OFFSET = 2**40 + 42  # pamqp writes ints in the smallest type; RabbitMQ writes offsets as 'l', and so does pamqp for this


def _content(**props: Any) -> bytes:
    return header.ContentHeader(0, 5, commands.Basic.Properties(**props)).marshal()


@pytest.mark.parametrize(
    "props",
    [
        {"headers": {"x-stream-offset": OFFSET}},
        {"headers": {"a": "x-stream-offset", "x-stream-offset": OFFSET, "zz": [1, "two"]}},
        {"content_type": "text/plain", "content_encoding": "gzip", "headers": {"b": 1.5, "x-stream-offset": OFFSET}, "message_id": "m"},
        {
            "headers": {"nested": {"x-stream-offset": 7}, "x-stream-offset": OFFSET, "t": True},
            "delivery_mode": 2,
            "timestamp": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        },
    ],
)
def test_the_stream_offset_is_cut_out_of_the_header_and_nothing_else_changes(props: dict[str, Any]) -> None:
    raw = _content(**props)
    before, _ = decode_properties(raw[12:])
    lazy = LazyProperties(raw)
    assert find_header(raw, b"x-stream-offset") is not None
    assert lazy.pop_long_header("x-stream-offset") == OFFSET
    assert lazy.header != raw, "read without decoding: the raw header itself loses the entry"
    after, bad = decode_properties(lazy.header[12:])
    headers = {k: v for k, v in before[2].items() if k != "x-stream-offset"} or None
    assert not bad and after == [*before[:2], headers, *before[3:]]
    assert lazy.arrow_row()[12] == headers and lazy.arrow_row()[13] is None


def test_a_header_table_left_empty_goes_with_its_flag() -> None:
    lazy = LazyProperties(_content(headers={"x-stream-offset": OFFSET}))
    assert lazy.pop_long_header("x-stream-offset") == OFFSET
    assert lazy.header == _content(), "as if the publisher had sent no properties"
    assert lazy.arrow_row() == (None,) * 14


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-stream-offset": "42"}, None),  # not an integer: nothing taken
        ({"x-stream-offset": True}, None),
        ({"other": 1}, None),
        ({"other": 1, "x-stream-offset": 7}, 7),  # a small type ('b'): decoded the long way, still taken
        (None, None),
    ],
)
def test_an_offset_that_is_not_an_integer_is_not_taken(headers: Any, expected: Any) -> None:
    raw = _content(headers=headers)
    lazy = LazyProperties(raw)
    assert lazy.pop_long_header("x-stream-offset") == expected
    assert lazy.headers == ({k: v for k, v in headers.items() if expected is None or k != "x-stream-offset"} if headers else None)


def test_an_offset_of_another_integer_type_or_behind_an_unknown_type_is_decoded_the_long_way() -> None:
    # 'I' (signed 32) instead of RabbitMQ's 'l'; then a value of a type no walk can skip before it
    entry = b"\x0fx-stream-offsetI" + struct.pack(">i", 9)
    table = struct.pack(">I", len(entry)) + entry
    raw = struct.pack(">HHQH", 60, 0, 5, 0x2000) + table
    assert find_header(raw, b"x-stream-offset") == (ord("I"), 35, 18, 14)
    lazy = LazyProperties(raw)
    assert lazy.pop_long_header("x-stream-offset") == 9 and lazy.headers is None
    unknown = b"\x01a?" + b"\x0fx-stream-offsetl" + struct.pack(">q", 1)
    raw = struct.pack(">HHQH", 60, 0, 5, 0x2000) + struct.pack(">I", len(unknown)) + unknown
    assert find_header(raw, b"x-stream-offset") is None
    assert LazyProperties(raw).pop_long_header("x-stream-offset") is None  # the table is undecodable past 'a'


def test_a_table_that_overruns_its_size_is_left_to_the_full_decode() -> None:
    entry = b"\x0fx-stream-offsetl" + struct.pack(">q", 5)
    for size in (len(entry) - 1, len(entry) + 1):  # cuts the value short; claims more than the header holds
        raw = struct.pack(">HHQH", 60, 0, 5, 0x2000) + struct.pack(">I", size) + entry
        assert find_header(raw, b"x-stream-offset") is None
        lazy = LazyProperties(raw)
        assert lazy.pop_long_header("x-stream-offset") is None and lazy.undecodable


@pytest.mark.parametrize("value", [-1, -128, 127, -129, 65535, -(2**40)])
def test_a_small_negative_integer_in_a_field_table_is_a_signed_octet(value: int) -> None:
    # pamqp 3.x packed -128..-1 unsigned and raised struct.error (a consumer argument x-priority=-1 could not
    # be sent): the package needs pamqp 4.
    consume = framing.build(commands.Basic.Consume, queue="q", consumer_tag="t", arguments={"x-priority": value})
    frame = framing.method_frame(1, consume)
    decoded = framing.decode_method(frame[7:-1])  # the payload, without the frame header and end
    assert isinstance(decoded, commands.Basic.Consume) and decoded.arguments == {"x-priority": value}
