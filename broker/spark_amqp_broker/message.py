"""A message as queues hold it.

The content header is kept exactly as the publisher encoded it, so every
property and header of every field type reaches consumers byte for byte, and a
queued message costs one small object plus its two byte strings. Properties are
decoded only when routing or dead-lettering needs them.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import commands

from spark_amqp import errors

from . import codec


class Message:
    __slots__ = (
        "acquired",
        "amqp10",
        "body",
        "carried",
        "deaths",
        "delivery_count",
        "exchange",
        "expires_at",
        "first_death",
        "header",
        "redelivered",
        "routing_key",
        "seq",
    )

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self.seq = 0
        self.redelivered = False
        self.expires_at = 0.0  # loop time; 0 means never
        # A quorum queue's counts of returns: every one (x-acquired-count), and those that
        # count towards its delivery-limit (x-delivery-count), as RabbitMQ 4.3 keeps them.
        self.acquired = 0
        self.delivery_count = 0
        # The failed deliveries an AMQP 1.0 consumer is told of that happened in a queue it was dead-lettered
        # from (RabbitMQ carries its delivery_count annotation along; a reject counts one).
        self.carried = 0
        # Where it was dead-lettered before, newest first: what the broker itself recorded,
        # never an x-death header a publisher sent (RabbitMQ 4.x keeps it as annotations).
        self.deaths: list[Death] = []
        self.first_death: Death | None = None
        # What an AMQP 1.0 consumer is sent (amqp10_convert.Form): the message as an AMQP 1.0 publisher sent it,
        # or its conversion, made on its first such delivery.
        self.amqp10: Any = None

    def copy_for_queue(self) -> Message:
        """Each queue owns its position, TTL, redelivered flag and return counts; bytes are shared."""
        copy = Message(self.exchange, self.routing_key, self.header, self.body)
        copy.deaths, copy.first_death, copy.amqp10 = self.deaths, self.first_death, self.amqp10
        return copy

    @property
    def size(self) -> int:
        return len(self.body)

    def headers(self) -> dict[str, Any]:
        if not codec.header_flags(self.header) & codec.FLAG_HEADERS:
            return {}
        return codec.decode_properties(self.header).headers or {}

    def expiration_ms(self) -> int | None:
        """The per-message TTL, or None; a value RabbitMQ would reject is treated as absent."""
        if not codec.header_flags(self.header) & codec.FLAG_EXPIRATION:
            return None
        raw = codec.decode_properties(self.header).expiration
        try:
            value = int(raw) if raw is not None else None
        except ValueError:
            return None
        return value if value is not None and value >= 0 else None


def _find(parts: list[tuple[str, bytes]], name: str) -> bytes | None:
    for key, raw in parts:
        if key == name:
            return raw
    return None


def with_header_entries(header: bytes, update: dict[str, bytes], drop_expiration: bool = False, sort_keys: bool = False) -> bytes:
    """Return ``header`` with entries of its headers table replaced or added.

    ``update`` maps header names to raw typed values (type byte + encoding).
    A replaced entry moves to the end; ``sort_keys`` sorts the table by key bytes.
    Other properties and headers keep their exact encoding.
    """
    body_size = codec.header_body_size(header)
    _, parts = codec.split_properties(header)
    raw_table = _find(parts, "headers")
    entries = codec.split_table(raw_table) if raw_table is not None else []
    entries = [(k, v) for k, v in entries if k not in update] + list(update.items())
    if sort_keys:
        entries.sort(key=lambda entry: entry[0].encode("utf-8"))
    new_parts: list[tuple[str, bytes]] = []
    placed = False
    for name, raw in parts:
        if name == "headers":
            new_parts.append(("headers", codec.join_table(entries)))
            placed = True
        elif name == "expiration" and drop_expiration:
            continue
        else:
            new_parts.append((name, raw))
    if not placed:
        new_parts.append(("headers", codec.join_table(entries)))
        slot_order = commands.Basic.Properties.__slots__
        new_parts.sort(key=lambda p: slot_order.index(p[0]))
    return codec.join_properties(body_size, new_parts)


class Death:
    __slots__ = ("count", "exchange", "expiration", "queue", "reason", "routing_key", "time")

    def __init__(self, queue: str, reason: str, exchange: str, routing_key: str, expiration: str | None, time: int) -> None:
        self.queue, self.reason, self.exchange, self.routing_key = queue, reason, exchange, routing_key
        self.expiration, self.time, self.count = expiration, time, 1

    def encode(self) -> bytes:
        parts: list[tuple[str, bytes]] = [
            ("count", b"l" + struct.pack(">q", self.count)),
            ("reason", _longstr(self.reason)),
            ("queue", _longstr(self.queue)),
            ("time", b"T" + struct.pack(">Q", self.time)),
            ("exchange", _longstr(self.exchange)),
            ("routing-keys", b"A" + _array([self.routing_key])),
        ]
        if self.expiration is not None:
            parts.append(("original-expiration", _longstr(self.expiration)))
        return b"F" + codec.join_table(parts)


def sorted_headers(header: bytes) -> bytes:
    """``header`` with its headers table sorted by key, as RabbitMQ 4.x re-encodes every message
    it stores (3.10 kept the publisher's bytes); every other property keeps its encoding."""
    if not codec.header_flags(header) & codec.FLAG_HEADERS:
        return header
    try:
        _, parts = codec.split_properties(header)
        raw = _find(parts, "headers")
        keys = [k.encode("utf-8") for k, _ in codec.split_table(raw)] if raw is not None else []
    except (errors.AmqpProtocolError, ValueError, IndexError, struct.error):
        return header  # left as sent: it is refused or decoded leniently further on
    if keys == sorted(keys):
        return header
    return with_header_entries(header, {}, sort_keys=True)


def _longstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"S" + struct.pack(">I", len(raw)) + raw


def dead_letter(message: Message, queue: str, reason: str, exchange: str, routing_key: str) -> Message:
    """The copy RabbitMQ 4.x dead-letters, routed to ``exchange`` with ``routing_key``.

    x-death lists the broker's own record of earlier deaths, newest first, one entry
    per (queue, reason) with a count; x-first-death-* and x-last-death-* name the first
    and the latest. A per-message expiration moves to ``original-expiration`` so the
    copy does not expire again.
    """
    expiration = None
    if codec.header_flags(message.header) & codec.FLAG_EXPIRATION:
        expiration = codec.decode_properties(message.header).expiration
    now = int(datetime.datetime.now(datetime.UTC).timestamp())
    deaths = list(message.deaths)
    same = next((d for d in deaths if d.queue == queue and d.reason == reason), None)
    if same is not None:
        deaths.remove(same)
        death = Death(queue, reason, message.exchange, message.routing_key, same.expiration or expiration, now)
        death.count = same.count + 1
    else:
        death = Death(queue, reason, message.exchange, message.routing_key, expiration, now)
    deaths.insert(0, death)
    first = message.first_death or death
    update = {
        "x-death": b"A" + _raw_array([d.encode() for d in deaths]),
        "x-first-death-exchange": _longstr(first.exchange),
        "x-first-death-queue": _longstr(first.queue),
        "x-first-death-reason": _longstr(first.reason),
        "x-last-death-exchange": _longstr(death.exchange),
        "x-last-death-queue": _longstr(death.queue),
        "x-last-death-reason": _longstr(death.reason),
    }
    dead = Message(
        exchange,
        routing_key,
        with_header_entries(message.header, update, drop_expiration=expiration is not None, sort_keys=True),
        message.body,
    )
    dead.deaths, dead.first_death = deaths, first
    dead.carried = message.delivery_count or message.carried
    if message.amqp10 is not None:  # what an AMQP 1.0 consumer is sent stays the publisher's (amqp10_convert.Form)
        dead.amqp10 = message.amqp10 if expiration is None else message.amqp10.without_ttl()
    return dead


def _array(values: list[str]) -> bytes:
    return _raw_array([_longstr(v) for v in values])


def _raw_array(items: list[bytes]) -> bytes:
    payload = b"".join(items)
    return struct.pack(">I", len(payload)) + payload


def with_return_counts(header: bytes, acquired: int, delivery_count: int) -> bytes:
    """Quorum queues stamp a redelivery with how often it came back (RabbitMQ 4.3: x-acquired-count
    for every return, x-delivery-count for those that count towards the delivery-limit)."""
    update = {}
    if acquired:
        update["x-acquired-count"] = b"l" + struct.pack(">q", acquired)
    if delivery_count:
        update["x-delivery-count"] = b"l" + struct.pack(">q", delivery_count)
    return with_header_entries(header, update, sort_keys=True) if update else header
