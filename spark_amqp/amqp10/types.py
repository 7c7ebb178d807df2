"""AMQP 1.0's type system (part 1 of the spec), decode and encode: what stream messages are made of.

Values decode to Python: null ``None``; booleans; integers; floats; ``str`` for strings;
``Symbol`` for symbols; ``bytes`` for binary; ``Timestamp`` (ms since the epoch) for
timestamps; ``uuid.UUID``; ``decimal.Decimal`` is not produced (decimals are kept as
their bytes, ``Opaque``); lists, maps (``dict``, or a list of pairs when a key cannot be
a dict key) and arrays (``list``); a described value as ``Described``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import DecodeError

__all__ = ["Described", "Opaque", "Symbol", "Timestamp", "UByte", "UInt", "UShort", "decode", "encode"]


class Symbol(str):
    """An AMQP symbol: ASCII text with its own type code."""


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""


class UInt(int):
    """An AMQP uint (a plain int encodes as a ulong): what AMQP 1.0's performatives type most of their numbers as."""


class UShort(int):
    """An AMQP ushort (channel numbers)."""


class UByte(int):
    """An AMQP ubyte (settle modes, SASL outcome codes)."""


@dataclass(frozen=True)
class Described:
    descriptor: Any
    value: Any


@dataclass(frozen=True)
class Opaque:
    """A value kept as its encoded bytes (decimals, chars): rendered, never interpreted."""

    code: int
    data: bytes


_B = struct.Struct(">B")
_b = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_BB = struct.Struct(">BB")
_II = struct.Struct(">II")

Decoder = Callable[[bytes, int], tuple[Any, int]]


def decode(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """The value at ``pos`` and the position after it."""
    try:
        code = data[pos]
        handler = _DECODERS.get(code)
        if handler is None:
            raise DecodeError(f"AMQP 1.0: unknown type code {code:#04x} at byte {pos}")
        return handler(data, pos + 1)
    except (IndexError, struct.error):
        raise DecodeError(f"AMQP 1.0: value at byte {pos} runs past the end ({len(data)} bytes)") from None


def _fixed(fmt: struct.Struct, wrap: Callable[[Any], Any] = lambda v: v) -> Decoder:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return wrap(fmt.unpack_from(data, pos)[0]), pos + fmt.size

    return read


def _const(value: Any) -> Decoder:
    return lambda data, pos: (value, pos)


def _var(size: struct.Struct, wrap: Callable[[bytes], Any]) -> Decoder:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        (n,) = size.unpack_from(data, pos)
        start = pos + size.size
        if start + n > len(data):
            raise DecodeError(f"AMQP 1.0: a value of {n} bytes at byte {pos} runs past the end")
        return wrap(data[start : start + n]), start + n

    return read


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DecodeError(f"AMQP 1.0: a string is not UTF-8 ({err})") from None


def _items(data: bytes, pos: int, count: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(count):
        value, pos = decode(data, pos)
        out.append(value)
    return out, pos


def _compound(head: struct.Struct, is_map: bool) -> Decoder:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        size, count = head.unpack_from(data, pos)
        end = pos + head.size // 2 + size
        items, after = _items(data, pos + head.size, count)
        if after != end:
            raise DecodeError(f"AMQP 1.0: a {'map' if is_map else 'list'} at byte {pos} is {after - pos} bytes, its header says {size}")
        if not is_map:
            return items, end
        pairs = list(zip(items[::2], items[1::2], strict=True))
        try:
            return dict(pairs), end
        except TypeError:  # a key Python cannot hash (a list): keep the pairs
            return pairs, end

    return read


def _array(head: struct.Struct) -> Decoder:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        size, count = head.unpack_from(data, pos)
        end = pos + head.size // 2 + size
        at = pos + head.size
        descriptor = None
        if data[at] == 0x00:
            descriptor, at = decode(data, at + 1)
        code = data[at]
        handler = _DECODERS.get(code)
        if handler is None:
            raise DecodeError(f"AMQP 1.0: unknown array element type {code:#04x}")
        out = []
        at += 1
        for _ in range(count):
            value, at = handler(data, at)
            out.append(Described(descriptor, value) if descriptor is not None else value)
        return out, end

    return read


def _described(data: bytes, pos: int) -> tuple[Any, int]:
    descriptor, pos = decode(data, pos)
    value, pos = decode(data, pos)
    return Described(descriptor, value), pos


def _opaque(code: int, n: int) -> Decoder:
    return lambda data, pos: (Opaque(code, bytes(data[pos : pos + n])), pos + n)


_DECODERS: dict[int, Decoder] = {
    0x00: _described,
    0x40: _const(None),
    0x41: _const(True),
    0x42: _const(False),
    0x43: _const(0),
    0x44: _const(0),
    0x45: _const([]),
    0x50: _fixed(_B),
    0x51: _fixed(_b),
    0x52: _fixed(_B),
    0x53: _fixed(_B),
    0x54: _fixed(_b),
    0x55: _fixed(_b),
    0x56: _fixed(_B, bool),
    0x60: _fixed(_H),
    0x61: _fixed(_h),
    0x70: _fixed(_I),
    0x71: _fixed(_i),
    0x72: _fixed(_f),
    0x73: _opaque(0x73, 4),
    0x74: _opaque(0x74, 4),
    0x80: _fixed(_Q),
    0x81: _fixed(_q),
    0x82: _fixed(_d),
    0x83: _fixed(_q, Timestamp),
    0x84: _opaque(0x84, 8),
    0x94: _opaque(0x94, 16),
    0x98: lambda data, pos: (uuid.UUID(bytes=bytes(data[pos : pos + 16])), pos + 16),
    0xA0: _var(_B, bytes),
    0xA1: _var(_B, _utf8),
    0xA3: _var(_B, lambda raw: Symbol(raw.decode("ascii", "replace"))),
    0xB0: _var(_I, bytes),
    0xB1: _var(_I, _utf8),
    0xB3: _var(_I, lambda raw: Symbol(raw.decode("ascii", "replace"))),
    0xC0: _compound(_BB, False),
    0xD0: _compound(_II, False),
    0xC1: _compound(_BB, True),
    0xD1: _compound(_II, True),
    0xE0: _array(_BB),
    0xF0: _array(_II),
}


def encode(value: Any) -> bytes:
    """The smallest encoding of ``value`` (the types ``decode`` returns, and plain Python values)."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, Timestamp):
        return b"\x83" + _q.pack(value)
    if isinstance(value, UInt):
        return b"\x52" + _B.pack(value) if 0 < value < 256 else b"\x70" + _I.pack(value) if value else b"\x43"
    if isinstance(value, UShort):
        return b"\x60" + _H.pack(value)
    if isinstance(value, UByte):
        return b"\x50" + _B.pack(value)
    if isinstance(value, int):
        if 0 <= value < 256:
            return b"\x53" + _B.pack(value) if value else b"\x44"
        if 0 <= value < 2**64:
            return b"\x80" + _Q.pack(value)
        return b"\x81" + _q.pack(value)
    if isinstance(value, float):
        return b"\x82" + _d.pack(value)
    if isinstance(value, Symbol):
        raw = value.encode("ascii")
        return (b"\xa3" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb3" + _I.pack(len(raw))) + raw
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return (b"\xa1" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb1" + _I.pack(len(raw))) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return (b"\xa0" + _B.pack(len(raw)) if len(raw) < 256 else b"\xb0" + _I.pack(len(raw))) + raw
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, Opaque):
        return _B.pack(value.code) + value.data
    if isinstance(value, Described):
        return b"\x00" + encode(value.descriptor) + encode(value.value)
    if isinstance(value, dict):
        return _compound_bytes(0xC1, 0xD1, [encode(x) for kv in value.items() for x in kv])
    if isinstance(value, list | tuple):
        return _compound_bytes(0xC0, 0xD0, [encode(x) for x in value]) if value else b"\x45"
    raise TypeError(f"cannot encode {type(value).__name__} as AMQP 1.0")


def _compound_bytes(small: int, large: int, parts: list[bytes]) -> bytes:
    body = b"".join(parts)
    if len(body) + 1 < 256 and len(parts) < 256:
        return _BB.pack(small, len(body) + 1) + _B.pack(len(parts)) + body
    return _B.pack(large) + _II.pack(len(body) + 4, len(parts)) + body
