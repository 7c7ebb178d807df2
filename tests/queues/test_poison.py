"""Messages whose properties cannot all be decoded still become rows, and the stream goes on.

The bytes are written on the wire by a raw client, as a misbehaving publisher
would, and read back through the broker on both brokers.
"""

from __future__ import annotations

import decimal
import struct

from pamqp import commands, header

from ..brokers import counts
from ..rawclient import RawClient
from .driver import MicroBatchDriver

HUGE = 2**63 - 1  # a u64 timestamp Python's datetime cannot hold (year 292278994)


def _shortstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return bytes([len(raw)]) + raw


def _table(entries: list[tuple[str, bytes]]) -> bytes:
    payload = b"".join(_shortstr(k) + v for k, v in entries)
    return struct.pack(">I", len(payload)) + payload


def _header(flags: int, plist: bytes, size: int) -> bytes:
    return struct.pack(">HHQH", 60, 0, size, flags) + plist


MESSAGE_ID, TIMESTAMP, HEADERS = 1 << 7, 1 << 6, 1 << 13


def _publish_raw(url: str, queue: str, headers: list[bytes]) -> None:
    client = RawClient(url)
    try:
        client.handshake()
        client.read_method()  # open-ok
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=queue))
        client.read_method()
        client.send(1, commands.Confirm.Select())
        client.read_method()
        for raw in headers:
            client.publish_raw_header(1, "", queue, raw, b"b")
        confirmed = 0
        while confirmed < len(headers):  # the broker may confirm several with one multiple ack
            _, ack = client.read_method(timeout=10)
            assert isinstance(ack, commands.Basic.Ack), (ack, getattr(ack, "reply_text", None))
            confirmed = ack.delivery_tag
    finally:
        client.close()


def test_undecodable_properties_become_nulls_with_the_raw_header_kept(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    odd_types = [
        ("bytes", b"x" + struct.pack(">I", 3) + b"\x00\xff\x01"),
        ("decimal", b"D" + struct.pack(">Bi", 2, 12345)),
        ("void", b"V"),
        ("array", b"A" + struct.pack(">I", 11) + b"I" + struct.pack(">i", -7) + b"t\x01" + b"b\xff" + b"B\xff"),
        ("nested", b"F" + _table([("deep", b"u" + struct.pack(">H", 65535))])),
        ("short", b"s" + struct.pack(">h", -2)),
        ("double", b"d" + struct.pack(">d", 1.5)),
    ]
    raws = [
        _header(MESSAGE_ID | TIMESTAMP, _shortstr("ts-huge") + struct.pack(">Q", HUGE), 1),
        _header(
            HEADERS | MESSAGE_ID, _table([("when", b"T" + struct.pack(">Q", HUGE)), ("ok", b"S\x00\x00\x00\x01y")]) + _shortstr("hdr-ts"), 1
        ),
        _header(HEADERS | MESSAGE_ID, _table(odd_types) + _shortstr("odd-types"), 1),
        _header(MESSAGE_ID, _shortstr(b"\xff\xfe"), 1),
        header.ContentHeader(0, 1, commands.Basic.Properties(message_id="plain", timestamp=None)).marshal(),
    ]
    _publish_raw(amqp_url, q, raws)
    d = MicroBatchDriver(amqp_url, q, connectionTimeout=30)
    try:
        rows = d.drain(5, timeout=20)
        assert len(rows) == 5
        by_id = {r["message_id"]: r for r in rows}

        huge = by_id["ts-huge"]
        assert huge["timestamp"] is None and huge["raw_header"] is not None
        flags, ts = struct.unpack_from(">H", huge["raw_header"], 12)[0], huge["raw_header"][-8:]
        assert flags == MESSAGE_ID | TIMESTAMP and struct.unpack(">Q", ts)[0] == HUGE  # the lost value is all there

        hdr = by_id["hdr-ts"]
        assert dict(hdr["headers"]) == {"when": None, "ok": "y"} and hdr["raw_header"] is not None

        odd = dict(by_id["odd-types"]["headers"])
        assert by_id["odd-types"]["raw_header"] is None  # every value decoded: nothing to keep
        assert odd == {
            "bytes": "base64:AP8B",
            "decimal": str(decimal.Decimal("123.45")),
            "void": None,
            "array": "[-7,true,-1,255]",
            "nested": '{"deep":65535}',
            "short": "-2",
            "double": "1.5",
        }

        bad_id = next(r for r in rows if r["message_id"] is None)
        assert bad_id["raw_header"].endswith(b"\x02\xff\xfe")

        assert by_id["plain"]["raw_header"] is None
        # The stream went on: everything was planned, committed and acknowledged.
        d.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=20)
    finally:
        d.close()


def _poison(url: str, queue: str) -> None:
    _publish_raw(
        url,
        queue,
        [
            _header(MESSAGE_ID | TIMESTAMP, _shortstr("ts-huge") + struct.pack(">Q", HUGE), 1),
            _header(MESSAGE_ID, _shortstr(b"\xff\xfe"), 1),
            header.ContentHeader(0, 1, commands.Basic.Properties(message_id="plain")).marshal(),
        ],
    )


def test_a_read_of_body_and_delivery_tag_decodes_no_property(amqp_url: str, names, embedded_or_none, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """.schema("body BINARY, delivery_tag BIGINT"): no message's content header is decoded (a full read keeps the raw header
    of the first two, above), and the batches hold those columns only. With a journal, whose whole rows a restarted query
    replays whatever its columns, the message ids are read for the copies' fingerprints; the batches are the same."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    from spark_amqp.client import properties

    decoded: list[bytes] = []
    real = properties.decode_properties
    monkeypatch.setattr(properties, "decode_properties", lambda plist: decoded.append(plist) or real(plist))
    asked = StructType([StructField("body", BinaryType()), StructField("Delivery_Tag", LongType(), False)])
    for journal in (None, tmp_path / "journal"):
        q = names.queue()
        _poison(amqp_url, q)
        extra = {} if journal is None else {"journalLocation": str(journal)}
        d = MicroBatchDriver(amqp_url, q, asked, connectionTimeout=30, **extra)
        try:
            rows = d.drain(3, timeout=20)
            assert rows == [{"body": b"b", "Delivery_Tag": tag} for tag in (1, 2, 3)], journal
            assert bool(decoded) == (journal is not None), decoded
            d.idle_until(lambda q=q: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=20)
        finally:
            d.close()
