"""The stream protocol's framing: command keys, and the encoding of its types (big-endian
integers; strings with an int16 length, bytes with an int32 length, -1 meaning null;
arrays with an int32 count).

A frame is ``uint32 size | uint16 key | uint16 version | …``; a response has the
request's key with the top bit set, then its correlation id and a uint16 response code.
Both the client and the embedded broker build and read frames with these helpers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from ..errors import DecodeError

__all__ = ["OK", "RESPONSE", "Key", "Reader", "command", "frame", "map_", "response", "string", "strings"]

OK = 0x01
RESPONSE = 0x8000


class Key:
    DECLARE_PUBLISHER = 0x01
    PUBLISH = 0x02
    PUBLISH_CONFIRM = 0x03
    PUBLISH_ERROR = 0x04
    QUERY_PUBLISHER_SEQUENCE = 0x05
    DELETE_PUBLISHER = 0x06
    SUBSCRIBE = 0x07
    DELIVER = 0x08
    CREDIT = 0x09
    STORE_OFFSET = 0x0A
    QUERY_OFFSET = 0x0B
    UNSUBSCRIBE = 0x0C
    CREATE = 0x0D
    DELETE = 0x0E
    METADATA = 0x0F
    METADATA_UPDATE = 0x10
    PEER_PROPERTIES = 0x11
    SASL_HANDSHAKE = 0x12
    SASL_AUTHENTICATE = 0x13
    TUNE = 0x14
    OPEN = 0x15
    CLOSE = 0x16
    HEARTBEAT = 0x17
    ROUTE = 0x18
    PARTITIONS = 0x19
    CONSUMER_UPDATE = 0x1A
    EXCHANGE_COMMAND_VERSIONS = 0x1B
    STREAM_STATS = 0x1C


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">IHH")  # size, key, version
_REQ = struct.Struct(">IHHI")  # size, key, version, correlation id
_RESP = struct.Struct(">IHHIH")  # size, key, version, correlation id, response code


def string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode("utf-8")
    return _I16.pack(len(data)) + data


def strings(values: Iterable[str]) -> bytes:
    items = list(values)
    return _I32.pack(len(items)) + b"".join(string(v) for v in items)


def map_(values: Mapping[str, str]) -> bytes:
    return _I32.pack(len(values)) + b"".join(string(k) + string(v) for k, v in values.items())


def frame(key: int, version: int, body: bytes = b"") -> bytes:
    """A command without a correlation id (publish, deliver, credit, heartbeat, tune)."""
    return _HEAD.pack(4 + len(body), key, version) + body


def command(key: int, correlation: int, body: bytes = b"", version: int = 1) -> bytes:
    """A request, answered by a response with the same correlation id."""
    return _REQ.pack(8 + len(body), key, version, correlation) + body


def response(key: int, correlation: int, code: int, body: bytes = b"", version: int = 1) -> bytes:
    return _RESP.pack(10 + len(body), key | RESPONSE, version, correlation, code) + body


class Reader:
    """Reads one frame's fields in order; running past the end is a ``DecodeError``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _take(self, fmt: struct.Struct) -> int:
        try:
            (value,) = fmt.unpack_from(self.data, self.pos)
        except struct.error:
            raise DecodeError(f"stream protocol frame ends early (at byte {self.pos} of {len(self.data)})") from None
        self.pos += fmt.size
        return int(value)

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def u32(self) -> int:
        return self._take(_U32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DecodeError(f"stream protocol frame ends early (wants {n} bytes at byte {self.pos} of {len(self.data)})")
        value = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return value

    def string(self) -> str | None:
        n = self._take(_I16)
        if n < 0:
            return None
        try:
            return self.raw(n).decode("utf-8")
        except UnicodeDecodeError as err:
            raise DecodeError(f"stream protocol string is not UTF-8: {err}") from None

    def text(self) -> str:
        """A string that may not be null."""
        value = self.string()
        if value is None:
            raise DecodeError("stream protocol string is null where a value is required")
        return value

    def count(self) -> int:
        n = self._take(_I32)
        if n < 0 or n > len(self.data):
            raise DecodeError(f"stream protocol array of {n} items in a frame of {len(self.data)} bytes")
        return n

    def strings(self) -> list[str]:
        return [self.text() for _ in range(self.count())]

    def map(self) -> dict[str, str]:
        out = {}
        for _ in range(self.count()):
            key = self.text()
            out[key] = self.string() or ""
        return out

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.data)
