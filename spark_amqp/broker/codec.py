"""AMQP 0-9-1 wire codec for the embedded broker.

pamqp decodes and encodes method arguments and field tables; this module adds
what pamqp leaves to the caller: length framing, splitting bodies by frame_max,
and encoding replies *without* pamqp's constructor-time validation, which
rejects queue and exchange names that RabbitMQ accepts (any UTF-8 up to 255
bytes). The three frames on the delivery hot path (deliver, confirm ack/nack)
are packed with ``struct`` directly because they are sent once per message.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import base, commands, decode, encode

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_OVERHEAD = 8  # type(1) + channel(2) + size(4) + frame-end(1)

FRAME_HEAD = struct.Struct(">BHI")
METHOD_ID = struct.Struct(">HH")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_U32_INDEX = struct.Struct(">I")
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

BASIC_CLASS = 60
_DELIVER = METHOD_ID.pack(60, 60)
_GET_OK = METHOD_ID.pack(60, 71)
_ACK = METHOD_ID.pack(60, 80)
_NACK = METHOD_ID.pack(60, 120)


class DecodeError(Exception):
    """A frame whose payload does not decode as the method it claims to be."""


class UnknownMethod(DecodeError):
    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(f"unknown method {class_id}.{method_id}")
        self.class_id = class_id
        self.method_id = method_id


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return b"".join((FRAME_HEAD.pack(frame_type, channel, len(payload)), payload, FRAME_END_BYTE))


def method_frame(channel: int, method: base.Frame) -> bytes:
    return frame(FRAME_METHOD, channel, _U32_INDEX.pack(method.index) + encode_arguments(method))


def encode_arguments(method: base.Frame) -> bytes:
    """Encode a method's arguments the way ``Frame.marshal`` does, minus ``validate()``."""
    out: list[bytes] = []
    bits = 0
    bit_pos = -1
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name, None)
        if kind == "bit":
            if bit_pos == -1 or bit_pos == 8:
                if bit_pos == 8:
                    out.append(bytes((bits,)))
                bits, bit_pos = 0, 0
            if value:
                bits |= 1 << bit_pos
            bit_pos += 1
            continue
        if bit_pos != -1:
            out.append(bytes((bits,)))
            bit_pos = -1
        if kind == "table" and value is None:
            value = {}
        elif value is None:
            value = "" if kind in ("shortstr", "longstr") else 0
        out.append(encode.by_type(value, kind))
    if bit_pos != -1:
        out.append(bytes((bits,)))
    return b"".join(out)


def decode_method(payload: bytes) -> base.Frame:
    """Decode a method frame payload; pamqp's decode path does not validate names."""
    if len(payload) < 4:
        raise DecodeError("method frame shorter than its class and method ids")
    class_id, method_id = METHOD_ID.unpack_from(payload, 0)
    cls: type[base.Frame] | None = commands.INDEX_MAPPING.get((class_id << 16) | method_id)
    if cls is None:
        raise UnknownMethod(class_id, method_id)
    # __new__ skips the constructor's validation, which RabbitMQ does not do either.
    method = cls.__new__(cls)
    try:
        method.unmarshal(payload[4:])
    except (struct.error, ValueError, TypeError, UnicodeDecodeError, IndexError) as err:
        raise DecodeError(f"malformed {cls.name}: {err}") from err
    return method


def content_frames(channel: int, header: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Content header frame followed by body frames no larger than ``frame_max``."""
    frames = [frame(FRAME_HEADER, channel, header)]
    if body:
        chunk = frame_max - FRAME_OVERHEAD
        if len(body) <= chunk:
            frames.append(frame(FRAME_BODY, channel, body))
        else:
            view = memoryview(body)
            for start in range(0, len(body), chunk):
                frames.append(frame(FRAME_BODY, channel, bytes(view[start : start + chunk])))
    return frames


def _shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


def deliver_method(channel: int, consumer_tag: bytes, tag: int, redelivered: bool, exchange: str, routing_key: str) -> bytes:
    """basic.deliver; ``consumer_tag`` is pre-encoded as a shortstr by the consumer."""
    payload = b"".join(
        (
            _DELIVER,
            consumer_tag,
            _U64.pack(tag),
            b"\x01" if redelivered else b"\x00",
            _shortstr(exchange),
            _shortstr(routing_key),
        )
    )
    return frame(FRAME_METHOD, channel, payload)


def get_ok_method(channel: int, tag: int, redelivered: bool, exchange: str, routing_key: str, count: int) -> bytes:
    payload = b"".join(
        (
            _GET_OK,
            _U64.pack(tag),
            b"\x01" if redelivered else b"\x00",
            _shortstr(exchange),
            _shortstr(routing_key),
            struct.pack(">I", count),
        )
    )
    return frame(FRAME_METHOD, channel, payload)


def confirm_method(channel: int, tag: int, multiple: bool, ack: bool) -> bytes:
    if ack:
        payload = _ACK + _U64.pack(tag) + (b"\x01" if multiple else b"\x00")
    else:  # basic.nack bits: multiple, requeue (always false from a broker)
        payload = _NACK + _U64.pack(tag) + (b"\x01" if multiple else b"\x00")
    return frame(FRAME_METHOD, channel, payload)


def shortstr(value: str) -> bytes:
    return _shortstr(value)


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
    payload = b"".join(_shortstr(k) + v for k, v in entries)
    return struct.pack(">I", len(payload)) + payload


def encode_value(value: Any) -> bytes:
    return encode.encode_table_value(value)
