"""Publishing: properties and headers round-trip, mandatory returns, confirms, async clients."""

from __future__ import annotations

import datetime
import decimal
import struct
import threading
import time

import pika
import pytest
from pamqp import commands, frame, header

from ..rawclient import RawClient
from .helpers import connect, drain, ready_count


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


def _table(entries: list[tuple[str, bytes]]) -> bytes:
    payload = b"".join(bytes((len(k),)) + k.encode() + v for k, v in entries)
    return struct.pack(">I", len(payload)) + payload


# One header of every field type RabbitMQ's table grammar knows, hand-encoded.
ALL_FIELD_TYPES = [
    ("bool", b"t\x01"),
    ("i8", b"b\xff"),
    ("u8", b"B\xfe"),
    ("i16", b"s" + struct.pack(">h", -300)),
    ("u16", b"u" + struct.pack(">H", 60000)),
    ("i32", b"I" + struct.pack(">i", -70000)),
    ("u32", b"i" + struct.pack(">I", 4_000_000_000)),
    ("i64", b"l" + struct.pack(">q", -(2**40))),
    ("f32", b"f" + struct.pack(">f", 1.5)),
    ("f64", b"d" + struct.pack(">d", 2.25)),
    ("dec", b"D\x02" + struct.pack(">i", 12345)),
    ("str", b"S" + _s("ünïcode")),
    ("arr", b"A" + struct.pack(">I", 7) + b"S" + _s("ab")),
    ("ts", b"T" + struct.pack(">Q", 1_700_000_000)),
    ("tbl", b"F" + _table([("k", b"S" + _s("v"))])),
    ("void", b"V"),
    ("bytes", b"x" + struct.pack(">I", 3) + b"\x00\x01\x02"),
]


def _raw_header(body_size: int, fields: list[tuple[str, bytes]] = ALL_FIELD_TYPES) -> bytes:
    # content_type, content_encoding, headers, delivery_mode, priority, correlation_id,
    # reply_to, expiration(no), message_id, timestamp, type, user_id(no), app_id
    flags = 0x8000 | 0x4000 | 0x2000 | 0x1000 | 0x0800 | 0x0400 | 0x0200 | 0x0080 | 0x0040 | 0x0020 | 0x0008
    props = b"".join(
        [
            b"\x10application/json",
            b"\x04gzip",
            _table(fields),
            b"\x02",
            b"\x07",
            b"\x04corr",
            b"\x05reply",
            b"\x05msgid",
            struct.pack(">Q", 1_700_000_001),
            b"\x04kind",
            b"\x03app",
        ]
    )
    return struct.pack(">HHQH", 60, 0, body_size, flags) + props


def test_every_field_type_round_trips_byte_for_byte(amqp_url: str, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    client = RawClient(amqp_url)
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue=q))
    client.read_method()
    sent = _raw_header(5)
    client.publish_raw_header(1, "", q, sent, b"hello")
    client.send(1, commands.Basic.Get(queue=q, no_ack=True))
    ftype, _, _ = client.read_raw_frame()
    assert ftype == 1
    ftype, _, received = client.read_raw_frame()
    # 3.10 kept the publisher's bytes; 4.x re-encodes what it stores and sorts the headers
    # table by key, every value still encoded as sent.
    expected = sent if broker_version < (4, 0) else _raw_header(5, sorted(ALL_FIELD_TYPES))
    assert ftype == 2 and received == expected
    ftype, _, body = client.read_raw_frame()
    assert ftype == 3 and body == b"hello"
    client.close()


def test_pika_properties_round_trip(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ts = int(time.time())
    headers = {
        "s": "text",
        "i": 42,
        "big": 2**40,
        "neg": -5,
        "b": True,
        "d": decimal.Decimal("3.14"),
        "dt": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "n": None,
        "l": [1, "two", {"three": 3}],
        "t": {"nested": {"deeper": "yes"}},
        "raw": b"\x00\xff",
    }
    props = pika.BasicProperties(
        content_type="text/plain",
        content_encoding="utf-8",
        headers=headers,
        delivery_mode=2,
        priority=3,
        correlation_id="c-1",
        reply_to="replies",
        expiration="60000",
        message_id="m-1",
        timestamp=ts,
        type="t",
        user_id="guest",
        app_id="tests",
    )
    for body in (b"", b"\x00binary\xff", bytes(1024 * 1024)):
        ch.basic_publish("", q, body, props)
    got = drain(ch, q)
    assert [b for _, _, b in got] == [b"", b"\x00binary\xff", bytes(1024 * 1024)]
    p = got[0][1]
    for attr in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(p, attr) == getattr(props, attr), attr
    assert p.headers == headers
    conn.close()


def test_mandatory_unroutable_returns_312_before_confirm(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    client = RawClient(amqp_url)
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.send(1, commands.Confirm.Select())
    client.read_method()
    client.send(1, commands.Basic.Publish(exchange="amq.direct", routing_key="test.unbound.key", mandatory=True))
    client.send_raw(b"")
    from pamqp import frame, header

    client.send(1, header.ContentHeader(0, 3, commands.Basic.Properties(message_id="r1")))
    client.send_raw(frame._marshal(3, 1, b"abc"))
    _, ret = client.read_method()
    assert isinstance(ret, commands.Basic.Return) and ret.reply_code == 312 and ret.reply_text == "NO_ROUTE"
    _, content = client.read_frame()
    _, body = client.read_frame()
    assert content.properties.message_id == "r1" and body.value == b"abc"
    _, ack = client.read_method()
    assert isinstance(ack, commands.Basic.Ack) and ack.delivery_tag == 1


def test_mandatory_with_pika_raises_unroutable(amqp_url: str) -> None:
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", "test.unbound.key", b"m", mandatory=True)
    ch.basic_publish("amq.direct", "test.unbound.key", b"m")  # not mandatory: silently dropped, acked
    conn.close()


def test_publish_to_internal_exchange_is_403(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", internal=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(x, "", b"m")
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 403
    conn.close()


def test_immediate_flag_is_540(amqp_url: str) -> None:
    client = RawClient(amqp_url)
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.publish(1, "", "x", b"m")
    client.send(1, commands.Basic.Publish(exchange="", routing_key="x", immediate=True))
    client.send(1, header.ContentHeader(0, 0, commands.Basic.Properties()))
    _, close = client.read_method()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 540


def test_an_oversized_message_is_refused_once_its_whole_body_is_read(amqp_url: str, broker_version: tuple[int, int]) -> None:
    # The default max_message_size: 128 MiB up to 3.x, 16 MiB from 4.0 (the embedded broker's).
    limit = 128 * 1024 * 1024 if broker_version < (4, 0) else 16 * 1024 * 1024
    client = RawClient(amqp_url, timeout=30)
    client.handshake()
    client.read_method()
    client.open_channel(1)
    client.send(1, commands.Basic.Publish(exchange="", routing_key="test.nowhere"))
    client.send(1, header.ContentHeader(0, limit + 1, commands.Basic.Properties()))
    with pytest.raises(TimeoutError):  # the header says how big: RabbitMQ waits for the body all the same
        client.read_method(timeout=1.0)
    piece = b"x" * (client.frame_max - 8)
    for _ in range(limit // len(piece)):
        client.send_raw(frame._marshal(3, 1, piece))
    client.send_raw(frame._marshal(3, 1, piece[: limit % len(piece)]))
    with pytest.raises(TimeoutError):  # one byte to go
        client.read_method(timeout=0.5)
    client.send_raw(frame._marshal(3, 1, b"x"))
    _, close = client.read_method(timeout=30)
    assert isinstance(close, commands.Channel.Close)
    expected = f"PRECONDITION_FAILED - message size {limit + 1} is larger than configured max size {limit}"
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (406, expected, 60, 40)
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(2)  # only the channel went
    client.close()


class _AsyncPublisher:
    """pika SelectConnection publishing with a window of outstanding confirms."""

    def __init__(self, url: str, queue: str, count: int, window: int) -> None:
        self.url, self.queue, self.count, self.window = url, queue, count, window
        self.sent = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.error: str | None = None

    def run(self, timeout: float = 30) -> None:
        conn = pika.SelectConnection(pika.URLParameters(self.url), on_open_callback=self._on_open, on_open_error_callback=self._fail)
        self.conn = conn
        timer = threading.Timer(timeout, lambda: conn.ioloop.add_callback_threadsafe(conn.ioloop.stop))
        timer.start()
        conn.ioloop.start()
        timer.cancel()

    def _fail(self, *args) -> None:  # type: ignore[no-untyped-def]
        self.error = repr(args)
        self.conn.ioloop.stop()

    def _on_open(self, conn) -> None:  # type: ignore[no-untyped-def]
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, ch) -> None:  # type: ignore[no-untyped-def]
        self.ch = ch
        ch.confirm_delivery(self._on_confirm, callback=lambda _: self._pump())

    def _pump(self) -> None:
        while self.sent < self.count and self.sent - len(self.acked) - len(self.nacked) < self.window:
            self.sent += 1
            self.ch.basic_publish("", self.queue, b"%d" % self.sent)
        if len(self.acked) + len(self.nacked) == self.count:
            self.conn.close()
            self.conn.ioloop.stop()

    def _on_confirm(self, frame) -> None:  # type: ignore[no-untyped-def]
        method = frame.method
        tags = set(range(max(self.acked | self.nacked | {0}) + 1, method.delivery_tag + 1)) if method.multiple else {method.delivery_tag}
        (self.acked if isinstance(method, pika.spec.Basic.Ack) else self.nacked).update(tags)
        self._pump()


def test_select_connection_confirm_window(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = connect(amqp_url)
    conn.channel().queue_declare(q)
    pub = _AsyncPublisher(amqp_url, q, 5000, 200)
    pub.run()
    assert pub.error is None
    assert pub.acked == set(range(1, 5001)) and not pub.nacked
    assert ready_count(amqp_url, q) == 5000
    conn.close()


def test_select_connection_consumer_with_multi_ack(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(1000):
        ch.basic_publish("", q, b"%d" % i)
    got: list[bytes] = []

    def on_open(c) -> None:  # type: ignore[no-untyped-def]
        c.channel(on_open_callback=on_channel)

    def on_channel(sch) -> None:  # type: ignore[no-untyped-def]
        def on_message(chan, method, props, body) -> None:  # type: ignore[no-untyped-def]
            got.append(body)
            if len(got) % 100 == 0:
                chan.basic_ack(method.delivery_tag, multiple=True)
            if len(got) == 1000:
                sconn.close()

        sch.basic_qos(prefetch_count=100, callback=lambda _: sch.basic_consume(q, on_message))

    sconn = pika.SelectConnection(pika.URLParameters(amqp_url), on_open_callback=on_open, on_close_callback=lambda *a: sconn.ioloop.stop())
    timer = threading.Timer(30, lambda: sconn.ioloop.add_callback_threadsafe(sconn.ioloop.stop))
    timer.start()
    sconn.ioloop.start()
    timer.cancel()
    assert got == [b"%d" % i for i in range(1000)]
    assert ready_count(amqp_url, q) == 0
    conn.close()
