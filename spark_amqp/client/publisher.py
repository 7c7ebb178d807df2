"""The publishing side of the client: publish frames packed with ``struct``, confirms and returns parsed."""

from __future__ import annotations

import struct
from typing import Any

from .. import framing

__all__ = ["CONFIRMS", "RETURN", "parse_confirm", "parse_return", "publish_frames"]

_PUBLISH = struct.pack(">HHH", 60, 40, 0)
_ACK = struct.pack(">HH", 60, 80)
_NACK = struct.pack(">HH", 60, 120)
CONFIRMS = (_ACK, _NACK)
RETURN = struct.pack(">HH", 60, 50)
_U64 = struct.Struct(">Q")


def publish_frames(channel: int, exchange: bytes, routing_key: bytes, mandatory: bool, header: bytes, body: bytes, frame_max: int) -> bytes:
    """basic.publish and its content; ``exchange`` and ``routing_key`` are encoded shortstrs."""
    method = b"".join((_PUBLISH, exchange, routing_key, b"\x01" if mandatory else b"\x00"))
    frames = [framing.frame(framing.FRAME_METHOD, channel, method)]
    frames.extend(framing.content_frames(channel, header, body, frame_max))
    return b"".join(frames)


def parse_confirm(payload: bytes) -> tuple[int, bool, bool]:
    """basic.ack / basic.nack from the broker: (delivery tag, multiple, ack)."""
    return _U64.unpack_from(payload, 4)[0], bool(payload[12] & 1), payload[:4] == _ACK


def parse_return(payload: bytes) -> tuple[int, str, str, str]:
    """basic.return: (reply code, reply text, exchange, routing key)."""
    ret: Any = framing.decode_method(payload)
    return ret.reply_code or 0, ret.reply_text or "", ret.exchange or "", ret.routing_key or ""
