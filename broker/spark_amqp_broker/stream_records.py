"""A stream's records over both protocols, converted as RabbitMQ 4.3 converts them.

RabbitMQ stores every stream message as AMQP 1.0 and converts it for AMQP 0-9-1 readers.
The embedded broker keeps each record as it came instead, and converts it only when a
reader of the other protocol reads it:

- an AMQP 0-9-1 publish stays a ``Message`` (its AMQP 0-9-1 readers get it as before);
  a stream-protocol reader gets ``amqp10_of(message)``, the bytes RabbitMQ 4.3 would have
  stored (mc_amqpl's conversion plus the stream's annotations), built per chunk and kept;
- a stream-protocol publish is a ``NativeRecord``, its bytes as sent; an AMQP 0-9-1
  reader gets ``record.message(stream)`` (mc_amqpl's conversion back, with the
  ``x-stream-offset`` header), kept on the record. A record RabbitMQ cannot convert (not
  AMQP 1.0, or a value 0-9-1 has no type for) raises ``InternalError``: RabbitMQ's reader
  crashes there and the AMQP 0-9-1 connection closes with 541.

One difference stays: the embedded broker sorts a 0-9-1 message's headers when it takes
it, so its application properties and annotations come in key order, where RabbitMQ
keeps the publisher's.
"""

from __future__ import annotations

import re
import struct
import urllib.parse
import uuid
from typing import Any

from pamqp import commands

from spark_amqp import errors

from . import codec
from .message import Message
from .stream_args import internal_error
from .stream_typed import TV, ConversionError, encode, field_entry, fields, read

__all__ = [
    "NativeRecord",
    "Record",
    "SubEntry",
    "amqp091_of",
    "amqp10_bytes",
    "amqp10_of",
    "amqp10_parts",
    "record_size",
    "with_delivery_mode",
]

_HEADER, _ANNOTATIONS, _PROPERTIES, _APPLICATION, _DATA, _SEQUENCE, _VALUE = 0x70, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77
_SECTION_NAMES = {
    "amqp:header:list": 0x70,
    "amqp:delivery-annotations:map": 0x71,
    "amqp:message-annotations:map": 0x72,
    "amqp:properties:list": 0x73,
    "amqp:application-properties:map": 0x74,
    "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76,
    "amqp:amqp-value:*": 0x77,
    "amqp:footer:map": 0x78,
}
# What each section must be; RabbitMQ's decoder crashes on anything else (an empty list is 0x45, a list too).
_SHAPES = {0x70: "list", 0x71: "map", 0x72: "map", 0x73: "list", 0x74: "map", 0x75: "binary", 0x76: "list", 0x78: "map"}
_NULL: TV = ("null", None)
_AMQP10_TYPE = b"amqp-1.0"  # the type of a 0-9-1 message whose body is AMQP 1.0 sections
_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_Q = struct.Struct(">Q")
_SLOTS = commands.Basic.Properties.__slots__
_DELIVERY_MODE = commands.Basic.Properties.flags["delivery_mode"]


class SubEntry:
    """Several records in one entry (a stream client's sub-entry batching), kept whole as it came: RabbitMQ
    stores it so, and never decompresses it. Its records take an offset each and stay in one chunk. Those of
    a compressed one reach no AMQP 0-9-1 reader: RabbitMQ 4.x skips them, their offsets missing from what it
    delivers (3.10 crashed on them instead)."""

    __slots__ = ("compressed", "records", "wire")

    def __init__(self, wire: bytes, records: int, compressed: bool) -> None:
        self.wire = wire  # as the publish frame carried it, header included: what a stream-protocol reader gets
        self.records = records
        self.compressed = compressed


class NativeRecord:
    """A stream-protocol publish: its bytes (none for a record of a compressed sub-entry), the filter value
    its publish gave (publish v2), and the sub-entry it came in, if any."""

    __slots__ = ("_message", "amqp10", "entry", "filter_value", "offset", "raw")

    def __init__(self, raw: bytes, filter_value: str | None = None, entry: SubEntry | None = None) -> None:
        self.raw = raw
        self.filter_value = filter_value
        self.entry = entry
        self.offset = 0
        self._message: Message | None = None
        self.amqp10: Any = None  # its parts as an AMQP 1.0 reader is sent them (amqp10_convert), made on first read

    @property
    def skipped(self) -> bool:
        """Whether an AMQP 0-9-1 reader never gets it (it is in a compressed sub-entry)."""
        return self.entry is not None and self.entry.compressed

    def message(self, stream: str) -> Message:
        """The record as an AMQP 0-9-1 consumer gets it; ``InternalError`` when RabbitMQ cannot convert it."""
        if self._message is None:
            self._message = amqp091_of(self.raw, stream, self.offset)
        return self._message


Record = Message | NativeRecord


def record_size(record: Record) -> int:
    if isinstance(record, NativeRecord):
        return len(record.entry.wire) // record.entry.records if record.entry is not None else len(record.raw)
    return len(record.header) + len(record.body)


def amqp10_bytes(record: Record) -> bytes:
    return record.raw if isinstance(record, NativeRecord) else amqp10_of(record)


# -- AMQP 0-9-1 -> AMQP 1.0 -----------------------------------------------------------


def with_delivery_mode(header: bytes) -> bytes:
    """A 0-9-1 message's header as RabbitMQ 4.3 gives it back from a stream: one without a delivery
    mode was stored as not durable, and comes back with delivery mode 1."""
    if codec.header_flags(header) & _DELIVERY_MODE:
        return header
    _, parts = codec.split_properties(header)
    parts.append(("delivery_mode", b"\x01"))
    parts.sort(key=lambda part: _SLOTS.index(part[0]))
    return codec.join_properties(codec.header_body_size(header), parts)


def amqp10_of(message: Message) -> bytes:
    """The AMQP 1.0 record RabbitMQ 4.3 stores for an AMQP 0-9-1 publish to a stream."""
    header, annotations, bare = amqp10_parts(message)
    return _section(_HEADER, ("list", header)) + _section(_ANNOTATIONS, ("map", annotations)) + bare


def amqp10_parts(message: Message) -> tuple[list[TV], list[tuple[TV, TV]], bytes]:
    """mc_amqpl's conversion of an AMQP 0-9-1 message: its header's fields, its message annotations, and the
    sections after them (properties, application properties, body), encoded."""
    _, parts = codec.split_properties(message.header)
    raw = dict(parts)
    text = {name: value[1:] for name, value in raw.items() if name not in ("headers", "delivery_mode", "priority", "timestamp")}
    headers = fields(raw["headers"][4:]) if "headers" in raw else []
    # The broker's own x-stream-offset stamp is not part of what RabbitMQ stores; BCC never is.
    headers = [(k, kind, v) for k, kind, v in headers if k not in ("x-stream-offset", "BCC") and v[0] != "decimal"]
    ttl = _int(text.get("expiration"))
    header: list[TV] = [
        ("bool", raw.get("delivery_mode") == b"\x02"),
        ("ubyte", raw["priority"][0]) if "priority" in raw else _NULL,
        ("uint", ttl) if ttl is not None and 0 <= ttl < 2**32 else _NULL,
        ("bool", not message.deaths),  # first-acquirer
        ("uint", 0),  # delivery-count
    ]
    annotations: list[tuple[TV, TV]] = [
        (("symbol", "x-routing-key"), ("utf8", message.routing_key)),
        (("symbol", "x-exchange"), ("utf8", message.exchange)),
    ]
    if "message_type" in text:
        annotations.append((("symbol", "x-basic-type"), ("utf8", text["message_type"])))
    for key, kind, value in headers:
        if key.startswith("x-") and key not in ("x-exchange", "x-routing-key"):
            annotations.append((("symbol", key), value))
        elif key == "CC" and kind == ord("A"):
            annotations.append((("symbol", "x-cc"), value))
    application = [(("utf8", k), v) for k, kind, v in headers if not k.startswith("x-") and kind not in (ord("A"), ord("F"))]
    timestamp = _Q.unpack(raw["timestamp"])[0] * 1000 if "timestamp" in raw else None
    reply_to = text.get("reply_to")
    properties: list[TV] = [
        _id(text.get("message_id")),
        _wrap("binary", text.get("user_id")),
        _NULL,
        _NULL,
        _NULL if reply_to is None else ("utf8", b"/queues/" + urllib.parse.quote(reply_to, safe="").encode()),
        _id(text.get("correlation_id")),
        _wrap("symbol", text.get("content_type")),
        _wrap("symbol", text.get("content_encoding")),
        _NULL,
        _wrap("timestamp", timestamp),
        _wrap("utf8", text.get("app_id")),
    ]
    while properties and properties[-1] == _NULL:
        properties.pop()
    out = []
    if properties:
        out.append(_section(_PROPERTIES, ("list", properties)))
    if application:
        out.append(_section(_APPLICATION, ("map", application)))
    out.append(message.body if text.get("message_type") == _AMQP10_TYPE else _section(_DATA, ("binary", message.body)))
    return header, annotations, b"".join(out)


def _section(code: int, value: TV) -> bytes:
    return b"\x00\x53" + bytes([code]) + encode(value)


def _wrap(tag: str, value: Any) -> TV:
    return _NULL if value is None else (tag, value)


def _int(raw: bytes | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _id(raw: bytes | None) -> TV:
    """A message or correlation id: a ``urn:uuid:`` string becomes a uuid, as RabbitMQ converts it."""
    if raw is None:
        return _NULL
    if raw.startswith(b"urn:uuid:") and len(raw) == 45:
        try:
            return ("uuid", uuid.UUID(raw[9:].decode()).bytes)
        except ValueError:
            pass
    return ("utf8", raw)


# -- AMQP 1.0 -> AMQP 0-9-1 -----------------------------------------------------------


def amqp091_of(raw: bytes, stream: str, offset: int | None, queued: bool = False) -> Message:
    """An AMQP 1.0 record as RabbitMQ 4.3 gives it to an AMQP 0-9-1 consumer of ``stream``; ``offset`` None for a
    message of a classic or quorum queue, ``queued`` for one such a queue holds (RabbitMQ keeps no AMQP 1.0 header
    there, only its durable flag: false is no delivery mode, true or no header is 2)."""
    try:
        return _amqp091_of(raw, stream, offset, queued)
    except (errors.DecodeError, ConversionError, UnicodeDecodeError, struct.error, TypeError, ValueError) as err:
        raise internal_error() from err


class _Sections:
    __slots__ = ("annotations", "application", "body", "header", "properties", "value_body")

    def __init__(self, raw: bytes) -> None:
        self.header: list[TV] = []
        self.annotations: list[tuple[TV, TV]] = []
        self.properties: list[TV] = []
        self.application: list[tuple[TV, TV]] = []
        data: list[bytes] = []
        body_at = -1
        self.value_body = False
        pos = 0
        while pos < len(raw):
            section, end = read(raw, pos)
            if section[0] != "described":
                raise errors.DecodeError(f"AMQP 1.0: a {section[0]} where a section should be")
            (kind, descriptor), (shape, value) = section[1][0], section[1][1]
            code: int | None = descriptor if kind in ("ulong", "uint") else _SECTION_NAMES.get(str(descriptor))
            if code is not None and shape != _SHAPES.get(code, shape):
                raise errors.DecodeError(f"AMQP 1.0: section {code} is a {shape}")
            if code in (0x71, _ANNOTATIONS, 0x78) and any(k[0] != "symbol" or not k[1].startswith("x-") for k, _ in value):
                raise errors.DecodeError("AMQP 1.0: an annotation key RabbitMQ takes for reserved")
            if code == _HEADER:
                self.header = list(value)
            elif code == _ANNOTATIONS:
                self.annotations = list(value)
            elif code == _PROPERTIES:
                self.properties = list(value)
            elif code == _APPLICATION:
                self.application = list(value)
            elif code == _DATA:
                data.append(bytes(value))
                body_at = pos if body_at < 0 else body_at
            elif code in (_SEQUENCE, _VALUE):
                self.value_body = self.value_body or body_at < 0
                body_at = pos if body_at < 0 else body_at
            elif code is None or not 0x70 <= code <= 0x78:
                raise errors.DecodeError(f"AMQP 1.0: unknown section {descriptor!r}")
            pos = end
        if body_at < 0:
            raise errors.DecodeError("AMQP 1.0: a message without a body")
        # An amqp-value or amqp-sequence body goes to 0-9-1 as its encoded sections (type amqp-1.0).
        self.body = raw[body_at:] if self.value_body else b"".join(data)

    def annotation(self, name: str) -> TV | None:
        for (kind, key), value in self.annotations:
            if kind == "symbol" and key == name:
                return value
        return None

    def field(self, section: list[TV], index: int) -> TV:
        return section[index] if index < len(section) else _NULL


def _unwrap(value: TV | None) -> Any:
    if value is None or value[0] == "null":
        return None
    return int(value[1] / 1000) if value[0] == "timestamp" else value[1]


def _shortstr(value: TV | None) -> bytes | None:
    """A utf8 value short enough for an AMQP 0-9-1 short string; None for anything else."""
    if value is None or value[0] != "utf8":
        return None
    raw = value[1].encode("utf-8")
    return raw if len(raw) <= 255 else None


def _amqp091_of(raw: bytes, stream: str, offset: int | None, queued: bool = False) -> Message:
    s = _Sections(raw)
    durable, priority, ttl = s.field(s.header, 0), s.field(s.header, 1), s.field(s.header, 2)
    mode = (2 if durable[1] else 1) if durable[0] in ("bool", "boolean") else _unwrap(s.annotation("x-basic-delivery-mode"))
    if queued:
        mode = None if durable[0] in ("bool", "boolean") and not durable[1] else 2
    prio = _unwrap(priority) if priority != _NULL else _unwrap(s.annotation("x-basic-priority"))
    expiration = str(ttl[1]) if ttl != _NULL else _unwrap(s.annotation("x-basic-expiration"))
    msg_type = _AMQP10_TYPE if s.value_body else _unwrap(s.annotation("x-basic-type"))
    headers = [field_entry(k, v) for k, v in s.application if k[0] == "utf8" and len(k[1].encode()) <= 255 and v[0] != "as_is"]
    message_id, headers = _message_id(s.field(s.properties, 0), "x-message-id", headers)
    correlation_id, headers = _message_id(s.field(s.properties, 5), "x-correlation-id", headers)
    extra = []
    for (kind, key), value in s.annotations:
        if kind != "symbol" or value[0] == "as_is":
            continue
        if key == "x-cc":
            extra.append(field_entry("CC", value))
        elif key == "x-opt-rabbitmq-received-time" and value[0] == "timestamp":
            extra.append(field_entry("timestamp_in_ms", ("long", value[1])))
        elif key.startswith("x-") and len(key) <= 255 and not _internal(key):
            extra.append(field_entry(key, value))
    stamp = [] if offset is None else [field_entry("x-stream-offset", ("long", offset))]
    user_id = _unwrap(s.field(s.properties, 1))
    if isinstance(user_id, str):
        user_id = user_id.encode("utf-8")
    if not isinstance(user_id, bytes) or len(user_id) > 255 or b"\x00" in user_id or not _is_utf8(user_id):
        user_id = None
    reply_to = _shortstr(s.field(s.properties, 4))
    if reply_to is not None and reply_to.startswith(b"/queues/"):
        quoted = reply_to[len(b"/queues/") :]
        reply_to = None if _PERCENT.search(quoted) else urllib.parse.unquote_to_bytes(quoted)
    creation = s.field(s.properties, 9)
    timestamp = int(creation[1] / 1000) if creation[0] == "timestamp" else None
    table = _sorted_unique([*stamp, *extra, *headers])
    props = [
        ("content_type", _short(_unwrap(s.field(s.properties, 6)))),
        ("content_encoding", _short(_unwrap(s.field(s.properties, 7)))),
        ("headers", struct.pack(">I", len(table)) + table if table else None),
        ("delivery_mode", None if mode is None else bytes([mode])),
        ("priority", None if prio is None else bytes([prio])),
        ("correlation_id", _short(correlation_id)),
        ("reply_to", _short(reply_to)),
        ("expiration", _short(expiration)),
        ("message_id", _short(message_id)),
        ("timestamp", None if timestamp is None else _Q.pack(timestamp % 2**64)),
        ("message_type", _short(msg_type)),
        ("user_id", _short(user_id)),
        ("app_id", _short(_shortstr(s.field(s.properties, 10)))),
    ]
    header = codec.join_properties(len(s.body), [(name, value) for name, value in props if value is not None])
    exchange = s.annotation("x-exchange")
    return Message(exchange[1] if exchange is not None and exchange[0] == "utf8" else "", _routing_key(s, stream), header, s.body)


def _routing_key(s: _Sections, stream: str) -> str:
    """What RabbitMQ recovers as the first routing key: ``x-routing-key``, else the first ``x-cc`` key, else the stream."""
    key = s.annotation("x-routing-key")
    if key is not None and key[0] == "utf8":
        return str(key[1])
    cc = s.annotation("x-cc")
    if cc is not None and cc[0] == "list" and cc[1] and isinstance(cc[1][0][1], str):
        return str(cc[1][0][1])
    return stream


def _message_id(value: TV, header: str, headers: list[bytes]) -> tuple[Any, list[bytes]]:
    """A message or correlation id as 0-9-1 takes it; one it cannot becomes an ``x-…`` header."""
    tag, v = value
    if tag == "null":
        return None, headers
    if tag == "uuid":
        return f"urn:uuid:{v}", headers
    if tag == "ulong":
        return str(v), headers
    if tag == "binary":  # kept as a 0-9-1 byte array, not a string
        name = header.encode()
        return None, [bytes([len(name)]) + name + b"x" + struct.pack(">I", len(v)) + bytes(v), *headers]
    if tag == "utf8":
        if len(v.encode("utf-8")) <= 255:
            return v, headers
        return None, [field_entry(header, value), *headers]
    raise ConversionError(f"RabbitMQ converts no {tag} message id to AMQP 0-9-1")


def _short(value: Any) -> bytes | None:
    if value is None:
        return None
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if not isinstance(raw, bytes):
        raise ConversionError(f"a {type(value).__name__} where AMQP 0-9-1 wants a short string")
    if len(raw) > 255:
        raise ConversionError("a short string of more than 255 bytes")
    return bytes([len(raw)]) + raw


def _sorted_unique(entries: list[bytes]) -> bytes:
    """Table entries sorted by name, the first of each name kept (RabbitMQ's usort of the headers)."""
    seen: dict[bytes, bytes] = {}
    for entry in entries:
        seen.setdefault(entry[1 : 1 + entry[0]], entry)
    return b"".join(seen[name] for name in sorted(seen))


def _internal(key: str) -> bool:
    return key.startswith("x-basic-") or key in ("x-routing-key", "x-exchange", "x-death")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
