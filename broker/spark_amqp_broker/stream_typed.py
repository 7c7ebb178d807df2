"""Typed values for the conversions a stream makes between AMQP 0-9-1 and AMQP 1.0.

RabbitMQ maps each type of one protocol to one of the other (mc_amqpl's tables): a 0-9-1
signed int is an AMQP 1.0 int and comes back as a signed int, a ulong comes back as a
long, a boolean header as a bool. ``stream_protocol.amqp10_types`` decodes values to plain
Python and forgets which type a number had, which these tables need; so values here are
``(type, value)`` pairs. Scalars are still read by that module and only tagged here by
their type code; compound values (lists, maps, described values) are walked here so that
their items keep their types too.

The AMQP 1.0 encoding follows RabbitMQ's generator byte for byte (the short forms it
picks, 0x56 for a converted boolean, list8 below 255 items and 256 bytes), so that a
record converted here is the record RabbitMQ 4.3 stores.
"""

from __future__ import annotations

import struct
from typing import Any

from spark_amqp.amqp10.types import decode
from spark_amqp.errors import DecodeError

__all__ = ["TV", "ConversionError", "encode", "field", "fields", "read"]

TV = tuple[str, Any]  # (AMQP 1.0 type name, value); strings are str, binary is bytes


class ConversionError(ValueError):
    """A value RabbitMQ cannot convert (its conversion crashes: 541 for an AMQP 0-9-1 reader)."""


_TAGS = {
    0x40: "null",
    0x41: "bool",
    0x42: "bool",
    0x56: "boolean",
    0x43: "uint",
    0x52: "uint",
    0x70: "uint",
    0x44: "ulong",
    0x53: "ulong",
    0x80: "ulong",
    0x50: "ubyte",
    0x51: "byte",
    0x60: "ushort",
    0x61: "short",
    0x54: "int",
    0x71: "int",
    0x55: "long",
    0x81: "long",
    0x72: "float",
    0x82: "double",
    0x73: "char",
    0x74: "decimal",
    0x84: "decimal",
    0x94: "decimal",
    0x83: "timestamp",
    0x98: "uuid",
    0xA0: "binary",
    0xB0: "binary",
    0xA1: "utf8",
    0xB1: "utf8",
    0xA3: "symbol",
    0xB3: "symbol",
    0x45: "list",
    0xC0: "list",
    0xD0: "list",
    0xC1: "map",
    0xD1: "map",
}
# Array item constructors RabbitMQ's parser takes (no compact ones such as smallint or str8-as-list).
_ARRAY_ELEMENTS = frozenset(
    {
        0xA3,
        0xB3,
        0xA0,
        0xA1,
        0xB0,
        0xB1,
        0x50,
        0x51,
        0x60,
        0x61,
        0x70,
        0x71,
        0x72,
        0x73,
        0x82,
        0x80,
        0x81,
        0x56,
        0x83,
        0x98,
        0xD0,
        0xD1,
        0xF0,
    }
)
_BB = struct.Struct(">BB")
_II = struct.Struct(">II")


def read(data: bytes, pos: int = 0) -> tuple[TV, int]:
    """The typed value at ``pos`` and the position after it; ``DecodeError`` if it is not one."""
    try:
        return _read(data, pos)
    except (IndexError, struct.error):
        raise DecodeError(f"AMQP 1.0: value at byte {pos} runs past the end ({len(data)} bytes)") from None


def _read(data: bytes, pos: int) -> tuple[TV, int]:
    code = data[pos]
    if code == 0x00:
        descriptor, at = _read(data, pos + 1)
        value, end = _read(data, at)
        return ("described", (descriptor, value)), end
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        small = code < 0xD0
        size, count = (_BB if small else _II).unpack_from(data, pos + 1)
        at, end = (pos + 3, pos + 2 + size) if small else (pos + 9, pos + 5 + size)
        items = []
        for _ in range(count):
            item, at = _read(data, at)
            items.append(item)
        if at != end:
            raise DecodeError(f"AMQP 1.0: a compound value at byte {pos} is {at - pos} bytes, its header says otherwise")
        if code in (0xC1, 0xD1):
            return ("map", list(zip(items[::2], items[1::2], strict=True))), end
        return ("list", items), end
    if code in (0xE0, 0xF0):
        # Array items share one constructor: decoded untyped, then all tagged with it.
        values, end = decode(data, pos)
        at = pos + (3 if code == 0xE0 else 9)
        if data[at] == 0x00:
            _, at = _read(data, at + 1)
        element = data[at]
        if 0x40 <= element <= 0x45:
            return ("as_is", None), end  # zero-width items: RabbitMQ keeps them opaque and converts nothing
        if element not in _ARRAY_ELEMENTS:
            raise DecodeError(f"AMQP 1.0: RabbitMQ reads no array of {element:#04x} items")
        kind = _TAGS.get(element, "array")
        return ("array", (kind, [(kind, v) for v in values])), end
    tag = _TAGS.get(code)
    if tag is None:
        raise DecodeError(f"AMQP 1.0: unknown type code {code:#04x} at byte {pos}")
    value, end = decode(data, pos)
    return (tag, value), end


# -- AMQP 1.0 encoding --------------------------------------------------------------

_FIXED = {
    "ubyte": b"\x50>B",
    "byte": b"\x51>b",
    "ushort": b"\x60>H",
    "short": b"\x61>h",
    "float": b"\x72>f",
    "double": b"\x82>d",
    "timestamp": b"\x83>q",
}
_VARIABLE = {"binary": (0xA0, 0xB0), "utf8": (0xA1, 0xB1), "symbol": (0xA3, 0xB3)}


def encode(value: TV) -> bytes:
    tag, v = value
    if tag == "null":
        return b"\x40"
    if tag == "bool":
        return b"\x41" if v else b"\x42"
    if tag == "boolean":
        return b"\x56\x01" if v else b"\x56\x00"
    if tag in _FIXED:
        fmt = _FIXED[tag]
        return fmt[:1] + struct.pack(fmt[1:].decode(), v)
    if tag in ("uint", "ulong"):
        zero, small, large, width = (0x43, 0x52, 0x70, ">I") if tag == "uint" else (0x44, 0x53, 0x80, ">Q")
        if v == 0:
            return bytes([zero])
        return bytes([small, v]) if v < 256 else bytes([large]) + struct.pack(width, v)
    if tag in ("int", "long"):
        if -129 < v < 128:
            return bytes([0x54 if tag == "int" else 0x55]) + struct.pack(">b", v)
        return b"\x71" + struct.pack(">i", v) if tag == "int" else b"\x81" + struct.pack(">q", v)
    if tag in _VARIABLE:
        raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        small, large = _VARIABLE[tag]
        return (bytes([small, len(raw)]) if len(raw) <= 255 else bytes([large]) + struct.pack(">I", len(raw))) + raw
    if tag == "uuid":
        return b"\x98" + (v.bytes if hasattr(v, "bytes") else bytes(v))
    if tag == "list":
        return _compound(0xC0, 0xD0, [encode(item) for item in v], len(v)) if v else b"\x45"
    if tag == "map":
        return _compound(0xC1, 0xD1, [encode(k) + encode(item) for k, item in v], 2 * len(v))
    if tag == "described":
        return b"\x00" + encode(v[0]) + encode(v[1])
    raise ConversionError(f"no AMQP 1.0 encoding for a {tag}")


def _compound(small: int, large: int, parts: list[bytes], count: int) -> bytes:
    body = b"".join(parts)
    if count >= 255 or len(body) + 1 >= 256:
        return bytes([large]) + _II.pack(len(body) + 4, count) + body
    return bytes([small, len(body) + 1, count]) + body


# -- AMQP 0-9-1 field tables --------------------------------------------------------

_SCALARS_091 = {
    ord("b"): (">b", "byte"),
    ord("B"): (">B", "ubyte"),
    ord("s"): (">h", "short"),
    ord("u"): (">H", "ushort"),
    ord("I"): (">i", "int"),
    ord("i"): (">I", "uint"),
    ord("l"): (">q", "long"),
    ord("L"): (">q", "long"),
    ord("d"): (">d", "double"),
    ord("f"): (">f", "float"),
}
_UTF8_SCAN_LIMIT = 4096  # RabbitMQ takes a longer string for binary without looking


def fields(table: bytes) -> list[tuple[str, int, TV]]:
    """A 0-9-1 field table's payload (after its length) as (key, 0-9-1 type code, AMQP 1.0 value)."""
    out = []
    pos = 0
    while pos < len(table):
        size = table[pos]
        key = table[pos + 1 : pos + 1 + size].decode("utf-8", "replace")
        kind = table[pos + 1 + size]
        value, pos = _field_value(kind, table, pos + 2 + size)
        out.append((key, kind, value))
    return out


def _field_value(kind: int, data: bytes, pos: int) -> tuple[TV, int]:
    """One 0-9-1 field value as RabbitMQ converts it to AMQP 1.0 (mc_amqpl:from_091)."""
    scalar = _SCALARS_091.get(kind)
    if scalar is not None:
        fmt = struct.Struct(scalar[0])
        return (scalar[1], fmt.unpack_from(data, pos)[0]), pos + fmt.size
    if kind in (ord("S"), ord("x"), ord("F"), ord("A")):
        (size,) = struct.unpack_from(">I", data, pos)
        raw = bytes(data[pos + 4 : pos + 4 + size])
        end = pos + 4 + size
        if kind == ord("F"):
            return ("map", [(("symbol", k), v) for k, _, v in fields(raw)]), end
        if kind == ord("A"):
            items, at = [], 0
            while at < len(raw):
                item, at = _field_value(raw[at], raw, at + 1)
                items.append(item)
            return ("list", items), end
        if kind == ord("S") and len(raw) <= _UTF8_SCAN_LIMIT and b"\x00" not in raw:
            try:
                return ("utf8", raw.decode("utf-8")), end
            except UnicodeDecodeError:
                pass
        return ("binary", raw), end
    if kind == ord("T"):
        return ("timestamp", struct.unpack_from(">Q", data, pos)[0] * 1000), pos + 8
    if kind == ord("t"):
        return ("boolean", data[pos] != 0), pos + 1
    if kind == ord("V"):
        return ("null", None), pos
    if kind == ord("D"):
        return ("decimal", bytes(data[pos : pos + 5])), pos + 5
    raise DecodeError(f"AMQP 0-9-1 field table: unknown field type {chr(kind)!r}")


_FIELD_CODES = {
    "long": b"l>q",
    "ulong": b"l>q",
    "byte": b"b>b",
    "ubyte": b"B>B",
    "short": b"s>h",
    "ushort": b"u>H",
    "uint": b"i>I",
    "int": b"I>i",
    "double": b"d>d",
    "float": b"f>f",
}


def field(value: TV, item: bool = False) -> bytes:
    """An AMQP 1.0 value as the 0-9-1 field RabbitMQ makes of it (mc_amqpl:to_091): type code and value.

    Raises ``ConversionError`` where RabbitMQ's conversion has no case (a uuid, a char, a
    decimal, a described value; in a list, also a ulong or an array): its AMQP 0-9-1 reader
    then closes with 541."""
    tag, v = value
    if item and tag in ("ulong", "array"):
        raise ConversionError(f"RabbitMQ converts no {tag} inside an AMQP 1.0 list to AMQP 0-9-1")
    if tag in ("utf8", "symbol", "binary"):
        raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return b"S" + struct.pack(">I", len(raw)) + raw
    code = _FIELD_CODES.get(tag)
    if code is not None:
        if tag == "ulong" and v >= 2**63:
            v -= 2**64  # written as a signed long, as RabbitMQ does
        return code[:1] + struct.pack(code[1:].decode(), v)
    if tag == "timestamp":
        seconds = int(v / 1000)  # Erlang's div: towards zero
        return b"T" + struct.pack(">Q", seconds % 2**64)
    if tag in ("bool", "boolean"):
        return b"t" + (b"\x01" if v else b"\x00")
    if tag == "null":
        return b"V"
    if tag in ("list", "array"):
        items = v if tag == "list" else v[1]
        payload = b"".join(field(entry, item=True) for entry in items if entry[0] != "as_is")
        return b"A" + struct.pack(">I", len(payload)) + payload
    if tag == "map":
        payload = b"".join(field_entry(key, item) for key, item in v if item[0] != "as_is")
        return b"F" + struct.pack(">I", len(payload)) + payload
    raise ConversionError(f"RabbitMQ converts no AMQP 1.0 {tag} to AMQP 0-9-1")


def field_entry(key: TV | str, value: TV) -> bytes:
    """One table entry; a map key is its value whatever its type (a number is not a valid name)."""
    name = key if isinstance(key, str) else key[1]
    if not isinstance(name, str | bytes):
        raise ConversionError(f"a map key of type {key[0]} cannot name an AMQP 0-9-1 field")
    raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    if len(raw) > 255:
        raise ConversionError("an AMQP 0-9-1 field name is at most 255 bytes")
    return bytes([len(raw)]) + raw + field(value)
