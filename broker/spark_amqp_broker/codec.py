"""Encoders only the embedded broker needs: deliveries, get-ok, and property and table surgery.

Generic framing lives in ``spark_amqp.framing`` (shared with the client). The
delivery frames are packed with ``struct`` because they are sent once per
message.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, decode, encode

from spark_amqp.errors import DecodeError
from spark_amqp.framing import FRAME_METHOD, METHOD_ID, frame, shortstr

BASIC_CLASS = 60
_DELIVER = METHOD_ID.pack(60, 60)
_GET_OK = METHOD_ID.pack(60, 71)
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def deliver_method(channel: int, consumer_tag: bytes, tag: int, redelivered: bool, exchange: str, routing_key: str) -> bytes:
    """basic.deliver; ``consumer_tag`` is pre-encoded as a shortstr by the consumer."""
    payload = b"".join(
        (
            _DELIVER,
            consumer_tag,
            _U64.pack(tag),
            b"\x01" if redelivered else b"\x00",
            shortstr(exchange),
            shortstr(routing_key),
        )
    )
    return frame(FRAME_METHOD, channel, payload)


def get_ok_method(channel: int, tag: int, redelivered: bool, exchange: str, routing_key: str, count: int) -> bytes:
    payload = b"".join(
        (
            _GET_OK,
            _U64.pack(tag),
            b"\x01" if redelivered else b"\x00",
            shortstr(exchange),
            shortstr(routing_key),
            struct.pack(">I", count),
        )
    )
    return frame(FRAME_METHOD, channel, payload)


# --- content header helpers -------------------------------------------------

# Property flag bits in the first flag word (AMQP 0-9-1 basic class order).
FLAG_HEADERS = 1 << 13
FLAG_EXPIRATION = 1 << 8


def header_body_size(header: bytes) -> int:
    return int(_U64.unpack_from(header, 4)[0])


def header_flags(header: bytes) -> int:
    return int(_U16.unpack_from(header, 12)[0])


def decode_properties(header: bytes) -> commands.Basic.Properties:
    props = commands.Basic.Properties.__new__(commands.Basic.Properties)
    for name in props.__slots__:
        setattr(props, name, None)
    props.unmarshal(header_flags(header), header[14:])
    return props


def split_properties(header: bytes) -> tuple[int, list[tuple[str, bytes]]]:
    """Flags and the raw encoding of each present property, in wire order.

    Lets the broker replace one property (headers, expiration) and keep every
    other byte as the publisher sent it.
    """
    flags = header_flags(header)
    if flags & 1:
        raise DecodeError("continued property flags are not supported")
    data = header[14:]
    out: list[tuple[str, bytes]] = []
    cls = commands.Basic.Properties
    for name in cls.__slots__:
        if flags & cls.flags[name]:
            consumed, _ = decode.by_type(data, getattr(cls, "_" + name))
            out.append((name, bytes(data[:consumed])))
            data = data[consumed:]
    return flags, out


def join_properties(body_size: int, parts: list[tuple[str, bytes]]) -> bytes:
    flags = 0
    cls = commands.Basic.Properties
    for name, _ in parts:
        flags |= cls.flags[name]
    return struct.pack(">HHQH", BASIC_CLASS, 0, body_size, flags) + b"".join(raw for _, raw in parts)


def split_table(raw: bytes) -> list[tuple[str, bytes]]:
    """A field table as (key, raw typed value) pairs, values left encoded."""
    length = struct.unpack_from(">I", raw, 0)[0]
    data = raw[4 : 4 + length]
    out: list[tuple[str, bytes]] = []
    offset = 0
    while offset < len(data):
        klen = data[offset]
        key = data[offset + 1 : offset + 1 + klen].decode("utf-8")
        offset += 1 + klen
        consumed, _ = decode.embedded_value(data[offset:])
        out.append((key, bytes(data[offset : offset + consumed])))
        offset += consumed
    return out


def join_table(entries: list[tuple[str, bytes]]) -> bytes:
    payload = b"".join(shortstr(k) + v for k, v in entries)
    return struct.pack(">I", len(payload)) + payload


def encode_value(value: Any) -> bytes:
    return encode.encode_table_value(value)
