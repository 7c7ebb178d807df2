"""AMQP 0-9-1 framing shared by the client and the embedded broker.

pamqp decodes and encodes method arguments and field tables; this module adds
what pamqp leaves to the caller: length framing, splitting bodies by
frame_max, and building and encoding methods *without* pamqp's
constructor-time validation, which rejects queue and exchange names that
RabbitMQ accepts (any UTF-8 up to 255 bytes, e.g. ``café``). Confirm frames,
sent once per message, are packed with ``struct`` directly.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar

from pamqp import base, commands, encode

from .errors import DecodeError, UnknownMethod

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

_ACK = METHOD_ID.pack(60, 80)
_NACK = METHOD_ID.pack(60, 120)

M = TypeVar("M", bound=base.Frame)


def build(cls: type[M], **fields: Any) -> M:
    """A method with ``fields`` set and the rest empty, skipping pamqp's name validation (see above)."""
    method = cls.__new__(cls)
    for name in cls.__slots__:
        setattr(method, name, fields.pop(name, None))
    if fields:
        raise TypeError(f"{cls.name} has no field(s) {', '.join(fields)}")
    return method


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


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((len(raw),)) + raw


def confirm_method(channel: int, tag: int, multiple: bool, ack: bool, requeue: bool = False) -> bytes:
    """basic.ack, or basic.nack (a broker's nack never requeues; a consumer's may)."""
    if ack:
        payload = _ACK + _U64.pack(tag) + (b"\x01" if multiple else b"\x00")
    else:  # basic.nack bits: multiple, requeue
        payload = _NACK + _U64.pack(tag) + bytes([(1 if multiple else 0) | (2 if requeue else 0)])
    return frame(FRAME_METHOD, channel, payload)
