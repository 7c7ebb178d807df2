"""Message properties, decoded on first use and never fatally.

A queue can hold any bytes a publisher sent: a ``timestamp`` past year 9999,
a header with a field type nobody knows, a ``message_id`` that is not UTF-8.
One such message must not stop a stream, and it is never acked before its
batch commits, so raising here would fail the query again after every
restart. So every property is decoded on its own: one that cannot be decoded
becomes ``None`` (a header value that cannot be, a null map value), the rest
keep their values, and ``undecodable`` tells the caller to keep the raw
content header (the source's ``raw_header`` column) so nothing is lost.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["ABSENT", "MAX_TIMESTAMP", "LazyProperties", "decode_properties", "find_header"]

# Wire order of basic's properties; bit 15 of the flags is the first.
NAMES = (
    "content_type",
    "content_encoding",
    "headers",
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
    "cluster_id",
)
_KINDS = "ssFoossssTssss"
_INDEX = {name: i for i, name in enumerate(NAMES)}
MAX_TIMESTAMP = 253402300799  # 9999-12-31T23:59:59Z: the last second Spark's TimestampType holds

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class _Bad(Exception):
    """One value could not be decoded; ``size`` bytes are skipped to go on (None: cannot go on)."""

    def __init__(self, size: int | None) -> None:
        self.size = size


_FIXED: dict[bytes, tuple[int, Callable[[bytes, int], Any]]] = {
    b"t": (1, lambda d, o: d[o] != 0),
    b"b": (1, lambda d, o: struct.unpack_from(">b", d, o)[0]),
    b"B": (1, lambda d, o: d[o]),
    b"s": (2, lambda d, o: struct.unpack_from(">h", d, o)[0]),
    b"u": (2, lambda d, o: _U16.unpack_from(d, o)[0]),
    b"I": (4, lambda d, o: struct.unpack_from(">i", d, o)[0]),
    b"i": (4, lambda d, o: _U32.unpack_from(d, o)[0]),
    b"l": (8, lambda d, o: struct.unpack_from(">q", d, o)[0]),
    b"L": (8, lambda d, o: struct.unpack_from(">q", d, o)[0]),
    b"f": (4, lambda d, o: struct.unpack_from(">f", d, o)[0]),
    b"d": (8, lambda d, o: struct.unpack_from(">d", d, o)[0]),
    b"D": (5, lambda d, o: decimal.Decimal(struct.unpack_from(">i", d, o + 1)[0]).scaleb(-d[o])),
    b"T": (8, lambda d, o: _timestamp(_U64.unpack_from(d, o)[0])),
    b"V": (0, lambda d, o: None),
}


def _timestamp(seconds: int) -> datetime.datetime:
    if seconds > MAX_TIMESTAMP:
        raise ValueError(seconds)
    return _EPOCH + datetime.timedelta(seconds=seconds)


def _value(data: bytes, offset: int, bad: list[bool]) -> tuple[Any, int]:
    """One typed field value at ``offset``: (value, next offset). A bad value is None and sets ``bad[0]``."""
    kind = data[offset : offset + 1]
    offset += 1
    fixed = _FIXED.get(kind)
    if fixed is not None:
        size, decode = fixed
        if offset + size > len(data):
            raise _Bad(None)
        try:
            return decode(data, offset), offset + size
        except (ValueError, OverflowError, decimal.InvalidOperation):
            bad[0] = True
            return None, offset + size
    if kind not in (b"S", b"x", b"A", b"F"):
        raise _Bad(None)  # an unknown type has no known size: the rest of the table is lost
    if offset + 4 > len(data):
        raise _Bad(None)
    size = _U32.unpack_from(data, offset)[0]
    start, end = offset + 4, offset + 4 + size
    if end > len(data):
        raise _Bad(None)
    raw = data[start:end]
    if kind == b"S":
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError:
            return raw, end  # binary in a long string is normal (pika sends bytes this way)
    if kind == b"x":
        return bytearray(raw), end
    try:
        return (_table(raw, bad) if kind == b"F" else _array(raw, bad)), end
    except _Bad:
        bad[0] = True
        return None, end


def _table(data: bytes, bad: list[bool]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    offset = 0
    while offset < len(data):
        klen = data[offset]
        raw_key = data[offset + 1 : offset + 1 + klen]
        offset += 1 + klen
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            key = raw_key.decode("utf-8", "replace")
            bad[0] = True
        table[key], offset = _value(data, offset, bad)
    return table


def _array(data: bytes, bad: list[bool]) -> list[Any]:
    values = []
    offset = 0
    while offset < len(data):
        value, offset = _value(data, offset, bad)
        values.append(value)
    return values


def _shortstr(data: bytes, offset: int) -> tuple[str | None, int, bool]:
    size = data[offset]
    end = offset + 1 + size
    if end > len(data):
        raise _Bad(None)
    try:
        return data[offset + 1 : end].decode("utf-8"), end, False
    except UnicodeDecodeError:
        return None, end, True


def decode_properties(plist: bytes) -> tuple[list[Any], bool]:
    """Property values in wire order (``NAMES``) from a property list (flags onward), and whether any was undecodable."""
    values: list[Any] = [None] * len(NAMES)
    if len(plist) < 2:
        return values, len(plist) != 0
    flags = _U16.unpack_from(plist, 0)[0]
    offset = 2
    bad = [False]
    try:
        word = flags
        while word & 1:  # continued flag words name no property of basic's: skip them, keep the raw header
            word = _U16.unpack_from(plist, offset)[0]
            offset += 2
            bad[0] = True
        for i, kind in enumerate(_KINDS):
            if not flags & (1 << (15 - i)):
                continue
            if kind == "s":
                values[i], offset, failed = _shortstr(plist, offset)
                bad[0] = bad[0] or failed
            elif kind == "o":
                values[i] = plist[offset]
                offset += 1
            elif kind == "T":
                seconds = _U64.unpack_from(plist, offset)[0]
                offset += 8
                if seconds <= MAX_TIMESTAMP:
                    values[i] = seconds
                else:
                    bad[0] = True
            else:  # the headers table
                size = _U32.unpack_from(plist, offset)[0]
                start, offset = offset + 4, offset + 4 + size
                if offset > len(plist):
                    raise _Bad(None)
                try:
                    values[i] = _table(plist[start:offset], bad)
                except _Bad:
                    bad[0] = True
    except (_Bad, IndexError, struct.error):
        bad[0] = True  # truncated: what was decoded stays, the rest is None
    return values, bad[0]


_SKIP = {kind[0]: size for kind, (size, _) in _FIXED.items()}
_SIZED = frozenset(b"SxAF")
_HEADERS_FLAG = 1 << (15 - _INDEX["headers"])
# find_header's answer for a key it knows is not there (no table, or every entry walked): no field type is 0.
ABSENT = (0, 0, 0, 0)


def find_header(header: bytes, key: bytes) -> tuple[int, int, int, int] | None:
    """Where one header lies in a content header: (field type byte, offset of its value, offset of
    its entry, offset of the table's size).

    Walks the table's keys and skips values by their sizes, building no objects,
    for a value wanted from every message (a stream's ``x-stream-offset``, a
    queue's ``x-delivery-count``, a filter value). ``ABSENT`` when the message
    has no headers or the whole table was walked without it, so that a message
    nobody asked the properties of is never decoded; None when the walk cannot
    tell (a continued flag word, a value type of unknown size, an entry past the
    table): ``decode_properties`` is the judge then.
    """
    try:
        flags = _U16.unpack_from(header, 12)[0]
        if flags & 1:
            return None
        if not flags & _HEADERS_FLAG:
            return ABSENT
        table = 14
        if flags & (1 << 15):  # content_type and content_encoding, the only properties before the table
            table += 1 + header[table]
        if flags & (1 << 14):
            table += 1 + header[table]
        end = table + 4 + _U32.unpack_from(header, table)[0]
        if end > len(header):
            return None
        offset = table + 4
        wanted = len(key)
        while offset < end:
            klen = header[offset]
            kind = header[offset + 1 + klen]
            at = offset + 2 + klen
            size = _SKIP.get(kind)
            if size is None:
                if kind not in _SIZED:
                    return None
                size = 4 + _U32.unpack_from(header, at)[0]
            if at + size > end:
                return None  # an entry overrunning its table: only the full decode can say what it is
            if klen == wanted and header.startswith(key, offset + 1):
                return kind, at, offset, table
            offset = at + size
        return ABSENT
    except (IndexError, struct.error):
        pass
    return None


def _without_entry(header: bytes, table: int, start: int, end: int) -> bytes:
    """``header`` without the table entry at ``start:end``; a table left empty goes with its flag."""
    size = _U32.unpack_from(header, table)[0] - (end - start)
    if size:
        return b"".join((header[:table], _U32.pack(size), header[table + 4 : start], header[end:]))
    flags = _U16.unpack_from(header, 12)[0] & ~_HEADERS_FLAG
    return b"".join((header[:12], _U16.pack(flags), header[14:table], header[end:]))


class LazyProperties:
    """A message's properties under pika's attribute names, decoded on first use.

    ``header`` is the content header frame's payload (class, weight, body
    size, flags, properties); most messages carry few properties or none, and
    those cost nothing until a batch is built.
    """

    __slots__ = ("_values", "header", "undecodable")

    def __init__(self, header: bytes) -> None:
        self.header = header
        self._values: list[Any] | None = None
        self.undecodable = False

    def _decoded(self) -> list[Any]:
        values = self._values
        if values is None:
            values, self.undecodable = decode_properties(self.header[12:])
            self._values = values
        return values

    @property
    def shared_key(self) -> bytes:
        """The encoded properties alone: equal keys, equal property columns (class, weight and body size left out)."""
        return self.header[12:]

    @property
    def core_header(self) -> bytes | None:
        """The content header for the compiled core to decode (reading.core_properties), while nothing was decoded
        from it: None after, as ``pop_long_header`` may then have taken a header out of the values and not the bytes."""
        return self.header if self._values is None else None

    def arrow_row(self) -> tuple[Any, ...]:
        """The values of the source's property columns in schema order, then ``raw_header``."""
        if self.header[12:14] == b"\x00\x00":
            return _NO_PROPERTIES
        v = self._decoded()
        return (
            v[8],  # message_id
            v[5],  # correlation_id
            v[0],  # content_type
            v[1],  # content_encoding
            v[10],  # type
            v[12],  # app_id
            v[11],  # user_id
            v[6],  # reply_to
            v[7],  # expiration
            v[4],  # priority
            v[3],  # delivery_mode
            v[9],  # timestamp, epoch seconds
            v[2],  # headers
            self.header if self.undecodable else None,
        )

    def pop_long_header(self, key: str) -> int | None:
        """Take an integer header out of the properties (None, and nothing taken, if there is none).

        For a broker's annotation that a column of its own holds: RabbitMQ adds
        ``x-stream-offset`` to every stream delivery. It is read and cut out of
        the raw header without decoding the rest when that can be done, so a
        message the publisher sent without properties still has none.
        """
        found = find_header(self.header, key.encode()) if self._values is None else None
        if found is ABSENT:
            return None
        if found is not None and found[0] == 0x6C:  # 'l', what RabbitMQ writes
            _, at, start, table = found
            offset = int(_I64.unpack_from(self.header, at)[0])
            self.header = _without_entry(self.header, table, start, at + 8)
            return offset
        values = self._decoded()
        headers = values[2]
        value = headers.get(key) if isinstance(headers, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        del headers[key]
        if not headers:
            values[2] = None
        return value

    def long_header(self, key: str) -> int | None:
        """An integer header, read without taking it out (None if absent or not an integer)."""
        found = find_header(self.header, key.encode()) if self._values is None else None
        if found is ABSENT:
            return None
        if found is not None and found[0] == 0x6C:
            return int(_I64.unpack_from(self.header, found[1])[0])
        headers = self._decoded()[2]
        value = headers.get(key) if isinstance(headers, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def text_header(self, key: str) -> str | None:
        """A string header (a long string, or bytes taken as UTF-8), read without taking it out; None otherwise."""
        found = find_header(self.header, key.encode()) if self._values is None else None
        if found is ABSENT:
            return None
        if found is not None and found[0] == 0x53:  # 'S'
            at = found[1]
            return self.header[at + 4 : at + 4 + _U32.unpack_from(self.header, at)[0]].decode("utf-8", "replace")
        headers = self._decoded()[2]
        value = headers.get(key) if isinstance(headers, dict) else None
        if isinstance(value, bytes | bytearray):
            return bytes(value).decode("utf-8", "replace")
        return value if isinstance(value, str) else None

    def __getattr__(self, name: str) -> Any:
        index = _INDEX.get("type" if name == "message_type" else name)
        if index is None:
            raise AttributeError(name)
        return self._decoded()[index]


_NO_PROPERTIES = (None,) * 14
