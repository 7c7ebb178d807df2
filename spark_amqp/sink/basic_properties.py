"""The AMQP 0-9-1 sink's content-header properties: pamqp marshals them, all but the ``headers`` table, written here.

pamqp 4.0 writes a floating-point header value in 32 bits (``f``): 0.1 arrives as 0.10000000149011612, and a value
past a float's range fails the batch. Here it keeps its 64 bits (``d``, as the sinks over AMQP 1.0 write it as a
double), and a key keeps all its bytes, up to the 255 a short string holds (pamqp cuts a key at 128 bytes, with a
warning). An infinite or NaN value is refused, naming its row: RabbitMQ closes the connection on it. Every other value
is pamqp's encoding, keys sorted as pamqp sorts them. The compiled core writes the same
bytes (core/src/content.rs).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from pamqp import commands, encode, header

__all__ = ["field_table", "marshal"]

_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS = 0x8000, 0x4000, 0x2000
_SIZE = struct.Struct(">I")


def marshal(properties: dict[str, Any]) -> bytes:
    """The flag word and the properties (pamqp's ``Basic.Properties`` keyword arguments), as a content header holds them."""
    headers = properties.get("headers")
    others = {k: v for k, v in properties.items() if k != "headers"}  # the caller's dict stays as it was
    raw = bytes(header.ContentHeader(0, 0, commands.Basic.Properties(**others)).marshal()[12:])
    if headers is None:
        return raw
    flags = int.from_bytes(raw[:2], "big") | _HEADERS
    at = 2  # headers come third, after content_type and content_encoding (short strings)
    for flag in (_CONTENT_TYPE, _CONTENT_ENCODING):
        if flags & flag:
            at += 1 + raw[at]
    return flags.to_bytes(2, "big") + raw[2:at] + field_table(headers) + raw[at:]


def field_table(table: dict[str, Any]) -> bytes:
    """A field table, its keys sorted; TypeError or ValueError naming a value that cannot be one."""
    parts = []
    for key, value in sorted(table.items()):
        raw = key.encode("utf-8")
        if len(raw) > 255:
            raise ValueError(f"header key {key[:40]!r}... is longer than 255 bytes")
        parts.append(bytes([len(raw)]) + raw)
        try:
            parts.append(_value(value))
        except TypeError as err:
            raise TypeError(f"{key} error: {err}") from err
    data = b"".join(parts)
    return _SIZE.pack(len(data)) + data


def _value(value: Any) -> bytes:
    if isinstance(value, float):
        if not math.isfinite(value):
            # RabbitMQ 3.10-4.3 close the connection (541 INTERNAL_ERROR) on such a value, which a retry repeats.
            raise ValueError(f"header value {value} is not a finite number, which RabbitMQ refuses over AMQP 0-9-1")
        return b"d" + encode.double(value)
    if isinstance(value, dict):
        return b"F" + field_table(value)
    if isinstance(value, list):
        data = b"".join(_value(v) for v in value)
        return b"A" + _SIZE.pack(len(data)) + data
    return bytes(encode.encode_table_value(value))
