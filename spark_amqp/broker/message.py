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

from . import codec


class Message:
    __slots__ = ("body", "deliveries", "exchange", "expires_at", "header", "redelivered", "routing_key", "seq")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self.seq = 0
        self.redelivered = False
        self.expires_at = 0.0  # loop time; 0 means never
        self.deliveries = 0

    def copy_for_queue(self) -> Message:
        """Each queue owns its position, TTL and redelivered flag; bytes are shared."""
        return Message(self.exchange, self.routing_key, self.header, self.body)

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


def _longstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"S" + struct.pack(">I", len(raw)) + raw


def _timestamp(now: datetime.datetime) -> bytes:
    return b"T" + struct.pack(">Q", int(now.timestamp()))


def dead_letter_header(message: Message, queue: str, reason: str) -> bytes:
    """The content header RabbitMQ 3.10 gives a dead-lettered message.

    x-death is a list of tables, newest first, one per (queue, reason) with a
    count; x-first-death-* record the first time. Per-message expiration is
    moved to ``original-expiration`` so the copy does not expire again.
    """
    headers = message.headers()
    deaths: list[dict[str, Any]] = list(headers.get("x-death") or [])
    expiration = None
    if codec.header_flags(message.header) & codec.FLAG_EXPIRATION:
        expiration = codec.decode_properties(message.header).expiration
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    existing = None
    for entry in deaths:
        if isinstance(entry, dict) and entry.get("queue") == queue and entry.get("reason") == reason:
            existing = entry
            break
    if existing is not None:
        deaths.remove(existing)
        count = int(existing.get("count", 0)) + 1
    else:
        count = 1
    entry_parts: list[tuple[str, bytes]] = [
        ("count", b"l" + struct.pack(">q", count)),
        ("reason", _longstr(reason)),
        ("queue", _longstr(queue)),
        ("time", _timestamp(now)),
        ("exchange", _longstr(message.exchange)),
        ("routing-keys", b"A" + _array([message.routing_key])),
    ]
    if expiration is not None:
        entry_parts.append(("original-expiration", _longstr(str(expiration))))
    new_entry = b"F" + codec.join_table(entry_parts)
    old_entries = [codec.encode_value(entry) for entry in deaths]
    death_array = b"A" + _raw_array([new_entry, *old_entries])
    update = {"x-death": death_array}
    if "x-first-death-queue" not in headers:
        update["x-first-death-exchange"] = _longstr(message.exchange)
        update["x-first-death-queue"] = _longstr(queue)
        update["x-first-death-reason"] = _longstr(reason)
    return with_header_entries(message.header, update, drop_expiration=expiration is not None)


def _array(values: list[str]) -> bytes:
    return _raw_array([_longstr(v) for v in values])


def _raw_array(items: list[bytes]) -> bytes:
    payload = b"".join(items)
    return struct.pack(">I", len(payload)) + payload


def with_delivery_count(header: bytes, count: int) -> bytes:
    """Quorum queues stamp redeliveries with x-delivery-count."""
    return with_header_entries(header, {"x-delivery-count": b"l" + struct.pack(">q", count)})
