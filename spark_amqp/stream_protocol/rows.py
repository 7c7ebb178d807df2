"""Stream records to the source's rows: the same columns, with the same values, as an AMQP 0-9-1 read.

RabbitMQ stores every message in a stream as AMQP 1.0 and converts it back when an AMQP 0-9-1
consumer reads it. A row read over the stream protocol must equal the row the 0-9-1 reader
makes of the same offset, so this module applies RabbitMQ's conversion, measured on each
version (``Conversion``; docs/streams.md, "Over the stream protocol"):

- exchange and routing key from the ``x-exchange`` / ``x-routing-key`` annotations (the
  stream's name and ``""`` when absent, as RabbitMQ shows a message published there directly);
- the AMQP 1.0 properties to the 0-9-1 ones of the same name; ``creation-time`` (ms) to
  ``timestamp`` (s); the header's ``durable``, ``priority`` and ``ttl`` to ``delivery_mode``,
  ``priority`` and ``expiration``;
- application properties to ``headers``; on 4.x, annotations other than routing ones too.

What differs by version: 3.x keeps 0-9-1 properties that AMQP 1.0 lacks as ``x-basic-*``
annotations and application properties; 4.x keeps ``type`` as an ``x-basic-type``
annotation and ``app_id`` as ``group-id``. 4.0 reads a message without a header section as
persistent; 4.3 gives it no delivery mode, and writes ``reply_to`` as a ``/queues/<name>``
address, which it converts back.

A record that is not AMQP 1.0 (rstream's binary mode) becomes its bytes as ``body`` and
nulls elsewhere: RabbitMQ cannot convert it for AMQP 0-9-1 at all (541).

A query that asks for some columns only (``reading.projection``) has only those computed: one that asks for nothing
held in the sections before the body (body, queue, offset) has each record split at its body by the sections' sizes,
none of them decoded, so a message whose properties cannot be decoded still reads.
"""

from __future__ import annotations

import datetime
import struct
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .. import amqp10
from ..amqp10.types import Described, Opaque, Timestamp
from ..property_columns import INT_PROPERTIES, STRING_PROPERTIES

__all__ = ["STANDARD", "Conversion", "RowMaker", "StreamProperties", "sized", "split"]

_NONE = (None,) * 14
_I = struct.Struct(">I")
_ROUTING = ("x-exchange", "x-routing-key")


@dataclass(frozen=True)
class Conversion:
    """How the broker the records came from converts AMQP 1.0 to 0-9-1, by its (major, minor)."""

    legacy: bool  # 3.x: x-basic-* annotations and application properties
    headerless_durable: bool  # 4.0-4.2: no header section reads as delivery_mode 2
    address_reply_to: bool  # 4.3+: reply_to as a /queues/<name> address

    @classmethod
    def of(cls, version: tuple[int, int] | None) -> Conversion:
        v = version or (4, 3)
        return cls(legacy=v < (4, 0), headerless_durable=(4, 0) <= v < (4, 3), address_reply_to=v >= (4, 3))


# A broker other than RabbitMQ (ActiveMQ Artemis over AMQP 1.0): the standard's sections as they are.
STANDARD = Conversion(legacy=False, headerless_durable=False, address_reply_to=False)


_BODY_SECTIONS = (amqp10.DATA, amqp10.AMQP_VALUE, amqp10.AMQP_SEQUENCE)


def split(record: bytes) -> tuple[int, bytes | None]:
    """Where the first body section starts, and the body when it is one data section, the last: found by the
    sections' sizes, without decoding them.

    The body is None for several data sections or an amqp-value body (``amqp10.sections`` decodes
    those whole), and the start is ``len(record)`` when a section before the body is not sized so.
    """
    start, body, _ = sized(record)
    return start, body


def sized(record: bytes) -> tuple[int, bytes | None, bytes]:
    """``split``'s, and the bytes of the header and message-annotations sections (what a delivery's redelivered flag,
    exchange and routing key come from: ``RowMaker.route``), found on the way."""
    pos = 0
    n = len(record)
    head = b""
    try:
        while pos < n and record[pos] == 0x00 and record[pos + 1] == 0x53:
            code = record[pos + 2]
            kind = record[pos + 3]
            at = pos + 4
            if code in _BODY_SECTIONS:
                if code == amqp10.DATA and kind in (0xA0, 0xB0):
                    size, width = (record[at], 1) if kind == 0xA0 else (_I.unpack_from(record, at)[0], 4)
                    if at + width + size == n:
                        return pos, record[at + width : n], head
                return pos, None, head
            if kind in (0xC0, 0xC1):
                end = at + 1 + record[at]
            elif kind in (0xD0, 0xD1):
                end = at + 4 + _I.unpack_from(record, at)[0]
            elif kind in (0x40, 0x45):  # null, empty list
                end = at
            else:
                break
            if code == amqp10.HEADER or code == amqp10.MESSAGE_ANNOTATIONS:
                head += record[pos:end]
            pos = end
    except (IndexError, struct.error):
        pass
    return n, None, head


class StreamProperties:
    """One record's property columns, as ``arrow.to_stream_batch`` asks for them, and by the names of
    AMQP 0-9-1's properties (what queue mode's ledger reads of a delivery).

    ``key`` is the record's sections before its body (``b"-"`` for a record that is not
    AMQP 1.0, which no prefix can be: a prefix starts with 0x00). ``redelivered``: the header
    says the message was delivered before (``first-acquirer`` sent false, or a ``delivery-count``).
    """

    __slots__ = ("columns", "key", "redelivered")

    def __init__(self, key: bytes, columns: tuple[Any, ...], redelivered: bool = False) -> None:
        self.key = key
        self.columns = columns
        self.redelivered = redelivered

    message_id = property(lambda self: self.arrow_row()[0])
    correlation_id = property(lambda self: self.arrow_row()[1])
    content_type = property(lambda self: self.arrow_row()[2])
    type = property(lambda self: self.arrow_row()[4])
    timestamp = property(lambda self: self.arrow_row()[11])
    headers = property(lambda self: self.arrow_row()[12])

    @property
    def shared_key(self) -> bytes:
        return self.key

    def arrow_row(self) -> tuple[Any, ...]:
        return self.columns

    def text_header(self, key: str) -> str | None:
        """A header that is text (or bytes taken as UTF-8), as ``LazyProperties.text_header`` reads it."""
        headers = self.arrow_row()[12]
        value = headers.get(key) if headers else None
        if isinstance(value, bytes | bytearray):
            return bytes(value).decode("utf-8", "replace")
        return value if isinstance(value, str) else None


_NOT_AMQP10 = StreamProperties(b"-", _NONE)
_NOT_DECODED = StreamProperties(b"", _NONE)  # nothing asked for is in the sections before the body
# What the sections before a body fill; raw_header is an AMQP 0-9-1 reader's only.
_SECTION_COLUMNS = frozenset({"exchange", "routing_key", *STRING_PROPERTIES, *INT_PROPERTIES, "timestamp", "headers"})


class RowMaker:
    """Rows of one stream's records. Records whose sections before the body are the same bytes (a
    publisher that sets the same properties on each message) are decoded once: the last
    ``CACHE`` distinct ones are kept. ``columns``: those to compute (None: all); the others are None."""

    CACHE = 1024

    def __init__(self, stream: str, conversion: Conversion, columns: Collection[str] | None = None) -> None:
        self.stream = stream
        self.conversion = conversion
        self._wanted = None if columns is None else frozenset(columns)
        self._decodes = self._wanted is None or bool(self._wanted & _SECTION_COLUMNS)
        self._known: dict[bytes, tuple[str, str, StreamProperties]] = {}
        self._last: tuple[bytes, tuple[str, str, StreamProperties]] | None = None

    def row(self, record: bytes, offset: int) -> tuple[bytes, str, str, str, int, Any]:
        """(body, stream, exchange, routing key, offset, properties): the tuple ``arrow.to_stream_batch`` takes."""
        if not self._decodes:
            return self._body_row(record, offset)
        last = self._last
        if last is not None and record.startswith(last[0]):
            # Most records of a chunk share the previous one's sections before the body: then only the
            # data section after them needs reading.
            at = len(last[0])
            if record[at : at + 3] == b"\x00\x53\x75":
                kind = record[at + 3]
                start = at + 5 if kind == 0xA0 else at + 8 if kind == 0xB0 else -1
                if start > 0 and start + (record[at + 4] if kind == 0xA0 else _I.unpack_from(record, at + 4)[0]) == len(record):
                    same = last[1]
                    return (record[start:], self.stream, same[0], same[1], offset, same[2])
        if not amqp10.is_amqp10(record):
            return (record, self.stream, None, None, offset, _NOT_AMQP10)  # type: ignore[return-value]
        start, body = split(record)
        parts = None
        if body is None:  # several data sections, or an amqp-value body: decode it whole
            parts = amqp10.sections(record)
            body = parts.body if parts.body is not None else _value_body(parts.value)
        prefix = record[:start]
        known = self._known.get(prefix)
        if known is None:
            if len(self._known) >= self.CACHE:
                self._known.clear()
            known = self._known[prefix] = self._decode(prefix, parts or amqp10.sections(prefix))
        self._last = (prefix, known)
        return (body, self.stream, known[0], known[1], offset, known[2])

    def _body_row(self, record: bytes, offset: int) -> tuple[bytes, str, str, str, int, Any]:
        """A row of no column from the sections before the body: the body found by the sections' sizes (``split``),
        nothing decoded but where that cannot find it."""
        if not amqp10.is_amqp10(record):
            return (record, self.stream, None, None, offset, _NOT_AMQP10)  # type: ignore[return-value]
        body = split(record)[1]
        if body is None:  # several data sections, an amqp-value body, a section not sized so: decode it whole
            parts = amqp10.sections(record)
            body = parts.body if parts.body is not None else _value_body(parts.value)
        return (body, self.stream, None, None, offset, _NOT_DECODED)  # type: ignore[return-value]

    def route(self, head: bytes) -> tuple[str, str, bool]:
        """The exchange, routing key and redelivered flag of ``head``, a message's header and message-annotations
        sections (``sized``)."""
        return _route(amqp10.sections(head), self.stream)

    def properties(self, prefix: bytes) -> tuple[Any, ...]:
        """The property columns of ``prefix``, a message's sections before its body: no cache is touched, so another
        thread than the one making rows may call it (queue mode's batches, ``queues.amqp10_rows``)."""
        return _columns(amqp10.sections(prefix), self.conversion, self._wanted)

    def _decode(self, prefix: bytes, parts: amqp10.Sections) -> tuple[str, str, StreamProperties]:
        """The routing and property columns of ``parts``, the sections of ``prefix`` (and perhaps a body)."""
        # Even no sections at all convert to something: 4.0 reads a message without a header as persistent.
        exchange, key, redelivered = _route(parts, self.stream)
        return exchange, key, StreamProperties(prefix, _columns(parts, self.conversion, self._wanted), redelivered)


def _route(parts: amqp10.Sections, stream: str) -> tuple[str, str, bool]:
    ann = parts.annotations
    header = parts.header
    # first-acquirer counts only when sent as false: ActiveMQ Artemis leaves it out (false, by the standard) on first
    # deliveries too, and marks a message that came back with delivery-count alone; RabbitMQ sends true, then false.
    redelivered = (len(header) > 3 and header[3] is False) or (len(header) > 4 and bool(header[4]))
    return str(ann.get("x-exchange") or ""), str(ann.get("x-routing-key", stream)), redelivered


def _value_body(value: Any) -> bytes:
    """An amqp-value body as bytes: text as UTF-8, binary as it is, other values as their text."""
    if isinstance(value, bytes):
        return value
    if value is None:
        return b""
    return str(value).encode("utf-8")


def _columns(parts: amqp10.Sections, conv: Conversion, wanted: frozenset[str] | None) -> tuple[Any, ...]:
    """The property columns' values; those that can fail to convert (a timestamp, the headers) only when ``wanted``
    (None: all), so that a value no query asked for never fails a read."""
    p = parts.property
    ann = parts.annotations
    apps = dict(parts.application_properties)
    header = parts.header + [None] * (3 - len(parts.header))
    if conv.legacy:
        msg_type = apps.pop("x-basic-type", None)
        app_id = apps.pop("x-basic-app-id", None)
        priority = ann.get("x-basic-priority")
        mode = ann.get("x-basic-delivery-mode")
        expiration = ann.get("x-basic-expiration")
        headers = apps
    else:
        msg_type = ann.get("x-basic-type")
        app_id = p("group_id")
        priority = header[1]
        durable = header[0] if parts.header else (True if conv.headerless_durable else None)
        mode = None if durable is None else 2 if durable else 1
        expiration = None if header[2] is None else str(header[2])
        headers = {str(k): v for k, v in ann.items() if k not in _ROUTING and not str(k).startswith("x-basic-")}
        headers.update(apps)
    # Over AMQP 0-9-1 the broker's own x-stream-offset header replaces a publisher's, and the source cuts it out.
    headers.pop("x-stream-offset", None)
    apps.pop("x-stream-offset", None)
    reply_to = p("reply_to")
    if conv.address_reply_to and isinstance(reply_to, str) and reply_to.startswith("/queues/"):
        reply_to = urllib.parse.unquote(reply_to[len("/queues/") :])
    created = p("creation_time") if wanted is None or "timestamp" in wanted else None
    if wanted is not None and "headers" not in wanted:
        headers = apps = {}
    return (
        _text(p("message_id")),
        _text(p("correlation_id")),
        _text(p("content_type")),
        _text(p("content_encoding")),
        _text(msg_type),
        _text(app_id),
        _text(p("user_id")),
        _text(reply_to),
        _text(expiration),
        priority,
        mode,
        None if created is None else int(created) // 1000,
        {str(k): _header_value(v) for k, v in headers.items()} if headers or apps else None,
        None,
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _header_value(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(int(value) // 1000, datetime.UTC)
    if isinstance(value, Opaque):
        return value.data
    if isinstance(value, Described):
        return _header_value(value.value)
    return value
