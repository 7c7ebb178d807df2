"""Messages between AMQP 1.0 and what the broker stores, as RabbitMQ 4.3's ``mc`` converts them.

A message published over AMQP 1.0 keeps its bare message (properties onward, as sent) in a ``Form``, beside the
AMQP 0-9-1 header and body its 0-9-1 consumers, routing, TTL and dead-lettering use (``stream_records.amqp091_of``,
mc_amqpl's conversion). RabbitMQ stores no AMQP 1.0 header for a classic or quorum queue, only its durable flag,
priority and ttl; an AMQP 1.0 consumer is sent a header rebuilt from them (``mc_amqp:protocol_state``), with
``first-acquirer`` false and ``delivery-count`` above 0 once the message came back, and message annotations
``x-exchange`` and ``x-routing-key`` from where it was published, not from what the publisher wrote. A message
published over AMQP 0-9-1 gets its ``Form`` on its first AMQP 1.0 delivery (``stream_records.amqp10_parts``,
mc_amqpl's conversion the other way), kept on the message.
"""

from __future__ import annotations

import struct
from typing import Any

from spark_amqp.amqp10 import types
from spark_amqp.amqp10.types import UByte, UInt, decode
from spark_amqp.errors import DecodeError

from .message import Message
from .stream_records import NativeRecord, amqp091_of, amqp10_parts
from .stream_typed import encode

__all__ = ["Form", "delivery_bytes", "form_of", "message_of", "parse", "properties", "received", "record_delivery", "stream_record"]

_Q = struct.Struct(">q")
_HEADER, _DELIVERY_ANNOTATIONS, _ANNOTATIONS = 0x70, 0x71, 0x72
# Annotations the broker writes itself on every delivery: a publisher's are not kept (RabbitMQ's filter).
_DEATHS = tuple(f"x-{which}-death-{field}" for which in ("first", "last") for field in ("reason", "queue", "exchange"))
_OWN = frozenset(
    ("x-exchange", "x-routing-key", "x-stream-offset", "x-acquired-count", "x-delivery-count", "x-death", "x-opt-deaths", *_DEATHS)
)
_ROUTING = frozenset(("x-exchange", "x-routing-key"))


class Form:
    """A message as AMQP 1.0 sends it, but for what each delivery sets: the header's durable, priority and ttl,
    the message annotations as encoded key-value pairs, and the bare message's bytes."""

    __slots__ = ("annotations", "bare", "durable", "priority", "ttl")

    def __init__(self, durable: bool, priority: int | None, ttl: int | None, annotations: list[tuple[str, bytes]], bare: bytes) -> None:
        self.durable = durable
        self.priority = priority
        self.ttl = ttl
        self.annotations = annotations
        self.bare = bare

    def without_ttl(self) -> Form:
        """The form of a dead-lettered copy whose expiration went (RabbitMQ resets the ttl)."""
        return Form(self.durable, self.priority, None, self.annotations, self.bare)


def _split_map(data: bytes, pos: int) -> tuple[list[tuple[Any, bytes]], int]:
    """A map's entries as (decoded key, the pair's bytes) and the position after it, the values' encodings kept."""
    code = data[pos]
    if code == 0xC1:
        size, count, at = data[pos + 1], data[pos + 2], pos + 3
        end = pos + 2 + size
    elif code == 0xD1:
        size, count = struct.unpack_from(">II", data, pos + 1)
        at, end = pos + 9, pos + 5 + size
    else:
        raise DecodeError(f"AMQP 1.0: message annotations that are not a map ({code:#04x})")
    pairs = []
    for _ in range(count // 2):
        key, after_key = decode(data, at)
        _, after = decode(data, after_key)
        pairs.append((key, bytes(data[at:after])))
        at = after
    return pairs, end


def parse(raw: bytes, keep_routing: bool = False) -> Form:
    """A message's sections as an AMQP 1.0 publisher sent them (``DecodeError`` if they are not). Delivery
    annotations are for one hop and dropped; ``keep_routing`` keeps ``x-exchange`` and ``x-routing-key`` (a stream
    record's, written when it was stored)."""
    durable, priority, ttl = False, None, None  # no header: not durable (RabbitMQ 4.3 reads it so)
    annotations: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(raw):
        if raw[pos] != 0x00:
            raise DecodeError("AMQP 1.0: a message section that is not described")
        descriptor, at = decode(raw, pos + 1)
        if descriptor not in (_HEADER, _DELIVERY_ANNOTATIONS, _ANNOTATIONS):
            return Form(durable, priority, ttl, annotations, raw[pos:])
        if descriptor == _ANNOTATIONS:
            pairs, pos = _split_map(raw, at)
            skip = _OWN - _ROUTING if keep_routing else _OWN
            annotations = [(str(k), pair) for k, pair in pairs if str(k) not in skip]
            continue
        value, pos = decode(raw, at)
        if descriptor == _HEADER and isinstance(value, list):
            durable = bool(value[0]) if value else False  # a header without durable says false (the spec's default)
            priority = value[1] if len(value) > 1 and isinstance(value[1], int) else None
            ttl = value[2] if len(value) > 2 and isinstance(value[2], int) else None
    raise DecodeError("AMQP 1.0: a message without a body")


# Publishers repeat the sections before the body (the sink, most clients): what they convert to is kept, by those
# bytes, so that a message costs its body's copy. A message qualifies when it ends with its one data section.
_CACHE_MAX = 1024
_PUBLISHED: dict[bytes, tuple[bytes, Form, int]] = {}  # sections before the body -> (0-9-1 header, form, bare's start)
_CONVERTED: dict[bytes, tuple[Form, bytes]] = {}  # a 0-9-1 header but its body size -> (form, bare before the body)
_U64 = struct.Struct(">Q")


def _data_at(raw: bytes) -> int:
    """Where the message's one and last data section starts, else -1 (an ``amqp-value`` body, several sections)."""
    at = raw.find(b"\x00\x53\x75")
    end = len(raw)
    while 0 <= at < end - 4:
        code = raw[at + 3]
        if (code == 0xA0 and at + 5 + raw[at + 4] == end) or (code == 0xB0 and at + 8 + int.from_bytes(raw[at + 4 : at + 8]) == end):
            return at
        at = raw.find(b"\x00\x53\x75", at + 1)
    return -1


def received(raw: bytes) -> tuple[Form, tuple[bytes, bytes] | None]:
    """A message an AMQP 1.0 publisher sent: its ``Form``, and its AMQP 0-9-1 header and body when known already."""
    at = _data_at(raw)
    hit = _PUBLISHED.get(raw[:at]) if at >= 0 else None
    if hit is None:
        return parse(raw), None
    header, template, bare_at = hit
    body = raw[at + 5 :] if raw[at + 3] == 0xA0 else raw[at + 8 :]
    form = Form(template.durable, template.priority, template.ttl, template.annotations, raw[bare_at:])
    return form, (header[:4] + _U64.pack(len(body)) + header[12:], body)


def message_of(form: Form, exchange: str, routing_key: str, known: tuple[bytes, bytes] | None = None, raw: bytes = b"") -> Message:
    """A message published over AMQP 1.0 (``received``) to ``exchange`` with ``routing_key``, as the broker stores
    it; ``raw``, the message as sent, lets its conversion serve the next ones with the same sections before the body."""
    if known is not None:
        message = Message(exchange, routing_key, *known)
    else:
        stored = _encode(form, None, None, True, 0, [])
        message = amqp091_of(stored, routing_key, None, queued=True)
        message.exchange, message.routing_key = exchange, routing_key
        at = _data_at(raw) if raw else -1
        if at >= 0 and raw.endswith(message.body) and len(raw) - at - len(message.body) in (5, 8) and len(raw) - len(form.bare) <= at:
            if len(_PUBLISHED) >= _CACHE_MAX:
                _PUBLISHED.clear()
            _PUBLISHED[raw[:at]] = (message.header, form, len(raw) - len(form.bare))
    message.amqp10 = form
    return message


def form_of(message: Message) -> Form:
    """The message's ``Form``: its own, or its conversion (made once, and once for every header like it)."""
    form: Form | None = message.amqp10
    if form is not None:
        return form
    key = message.header[:4] + message.header[12:]
    hit = _CONVERTED.get(key)
    if hit is not None:
        template, before = hit
        form = Form(template.durable, template.priority, template.ttl, template.annotations, before + _data(message.body))
    else:
        header, annotations, bare = amqp10_parts(message)
        pairs = [(str(k[1]), encode(k) + encode(v)) for k, v in annotations if str(k[1]) not in _OWN]
        durable = bool(header[0][1])
        priority = header[1][1] if header[1][0] != "null" else None
        ttl = header[2][1] if header[2][0] != "null" else None
        form = Form(durable, priority, ttl, pairs, bare)
        data = _data(message.body)
        if bare.endswith(data):  # not an amqp-1.0 typed message, whose body is its own sections
            if len(_CONVERTED) >= _CACHE_MAX:
                _CONVERTED.clear()
            _CONVERTED[key] = (form, bare[: len(bare) - len(data)])
    message.amqp10 = form
    return form


def _data(body: bytes) -> bytes:
    return b"\x00\x53\x75" + encode(("binary", body))


def _annotation(key: str, value: bytes) -> bytes:
    return encode(("symbol", key)) + value


def _utf8(key: str, value: str) -> bytes:
    return _annotation(key, encode(("utf8", value)))


def _long(key: str, value: int) -> bytes:
    return _annotation(key, b"\x81" + _Q.pack(value))


def _encode(form: Form, exchange: str | None, routing_key: str | None, first: bool, count: int, extra: list[bytes]) -> bytes:
    header = [form.durable, None if form.priority is None else UByte(form.priority), None if form.ttl is None else UInt(form.ttl)]
    head = b"\x00\x53\x70" + types.encode([*header, first, UInt(count)])
    # RabbitMQ 4.3's order: what the delivery adds, the routing key, the exchange, then the message's own.
    own = [_utf8("x-routing-key", routing_key), _utf8("x-exchange", exchange)] if exchange is not None and routing_key is not None else []
    pairs = [*extra, *own, *(pair for _, pair in form.annotations)]
    if pairs:
        body = b"".join(pairs)
        n = 2 * len(pairs)
        size = len(body) + 1
        head += b"\x00\x53\x72" + (bytes((0xC1, size, n)) if size < 256 and n < 256 else b"\xd1" + struct.pack(">II", size + 3, n)) + body
    return head + form.bare


def delivery_bytes(message: Message, quorum: bool) -> bytes:
    """What an AMQP 1.0 consumer of a classic or quorum queue is sent. The header's ``delivery-count`` counts the
    failed deliveries (``modified`` with ``delivery-failed``; on a quorum queue every return its delivery-limit
    counts); a quorum queue also annotates returns as it does over AMQP 0-9-1 (``x-acquired-count``,
    ``x-delivery-count``). Measured on RabbitMQ 4.3.6 (tests/broker/test_amqp10_links.py)."""
    form = form_of(message)
    extra: list[bytes] = []
    count = message.delivery_count or message.carried
    if quorum:
        if message.acquired:
            extra.append(_long("x-acquired-count", message.acquired))
        if message.delivery_count:
            extra.append(_long("x-delivery-count", message.delivery_count))
    if message.deaths:
        extra += _deaths(message)
    first = not message.redelivered and count == 0 and not message.deaths
    return _encode(form, message.exchange, message.routing_key, first, count, extra)


def _deaths(message: Message) -> list[bytes]:
    """A dead-lettered message's annotations as RabbitMQ 4.3 sends them over AMQP 1.0: the last and the first death,
    then ``x-opt-deaths`` (newest first; its times are the broker's, to the second), where AMQP 0-9-1 has x-death."""
    last, first = message.deaths[0], message.first_death or message.deaths[-1]
    out = [_utf8(f"x-last-death-{k}", v) for k, v in (("reason", last.reason), ("queue", last.queue), ("exchange", last.exchange))]
    out += [_utf8(f"x-first-death-{k}", v) for k, v in (("reason", first.reason), ("queue", first.queue), ("exchange", first.exchange))]
    records = []
    for d in message.deaths:
        at = ("timestamp", d.time * 1000)
        fields = [("queue", ("utf8", d.queue)), ("reason", ("symbol", d.reason)), ("count", ("ulong", d.count)), ("first-time", at)]
        fields += [("last-time", at), ("exchange", ("utf8", d.exchange)), ("routing-keys", ("list", [("utf8", d.routing_key)]))]
        records.append(("map", [(("symbol", k), v) for k, v in fields]))
    out.append(_annotation("x-opt-deaths", encode(("list", records))))
    return out


def properties(form: Form) -> list[Any]:
    """The message's properties section (``to`` is at 2, ``subject`` at 3), empty when it has none."""
    if form.bare[:3] != b"\x00\x53\x73":
        return []
    value, _ = decode(form.bare, 3)
    return value if isinstance(value, list) else []


def stream_record(form: Form, exchange: str, routing_key: str) -> NativeRecord:
    """A message published over AMQP 1.0 to a stream, as RabbitMQ stores it: its header (durable false when it had
    none), ``x-exchange`` and ``x-routing-key``, then its bare message; the filter value from its annotation
    ``x-stream-filter-value``, else its application property of that name."""
    record = NativeRecord(_encode(form, exchange, routing_key, True, 0, []), _filter_value(form))
    record.amqp10 = parse(record.raw, keep_routing=True)
    return record


def _filter_value(form: Form) -> str | None:
    for key, pair in form.annotations:
        if key == "x-stream-filter-value":
            _, at = decode(pair, 0)
            value, _ = decode(pair, at)
            return value if isinstance(value, str) else None
    try:
        from spark_amqp.amqp10 import sections

        value = sections(form.bare).application_properties.get("x-stream-filter-value")
    except DecodeError:
        return None
    return value if isinstance(value, str) else None


def record_delivery(record: Message | NativeRecord, offset: int) -> bytes:
    """A stream's record as an AMQP 1.0 reader is sent it: annotated with its ``x-stream-offset``."""
    if isinstance(record, NativeRecord):
        form = record.amqp10
        if form is None:
            form = record.amqp10 = parse(record.raw, keep_routing=True)
        return _encode(form, None, None, True, 0, [_long("x-stream-offset", offset)])
    form = form_of(record)
    return _encode(form, record.exchange, record.routing_key, True, 0, [_long("x-stream-offset", offset)])
