"""Stream filtering as RabbitMQ 3.13+ does it, per chunk (see tests/broker/test_streams.py).

Each chunk keeps a Bloom filter of its messages' ``x-stream-filter-value``
headers (16 bytes, RabbitMQ's default ``x-stream-filter-size-bytes``) and
whether any message has none. A consumer with ``x-stream-filter`` is sent a
chunk whole when the filter may hold one of its values, so it gets other values
too, and now and then a chunk that holds none of them: a client must filter
rows itself. A filter that is neither a string nor a list of strings is
ignored, as RabbitMQ 4.x ignores it.

A stream-protocol publisher names a message's filter value in its publish (version 2)
rather than in the message, and a stream-protocol subscriber gives its values as
``filter.<anything>`` properties (``protocol_filter``); both meet the same chunk filters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, cast

from spark_amqp.rabbitmq import FILTER_VALUE_HEADER

from .message import Message
from .stream_records import Record

__all__ = ["BLOOM_BITS", "ChunkFilter", "ConsumerFilter", "bloom_bits", "chunk_filter", "consumer_filter", "protocol_filter"]

BLOOM_BITS = 16 * 8
_HEADER_BYTES = FILTER_VALUE_HEADER.encode()


def bloom_bits(value: str) -> int:
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=4).digest()
    return (1 << (digest[0] << 8 | digest[1]) % BLOOM_BITS) | (1 << (digest[2] << 8 | digest[3]) % BLOOM_BITS)


class ChunkFilter:
    __slots__ = ("bloom", "unfiltered")

    def __init__(self, bloom: int, unfiltered: bool) -> None:
        self.bloom = bloom
        self.unfiltered = unfiltered  # a message without a filter value


def chunk_filter(records: Iterable[Record]) -> ChunkFilter:
    bloom, unfiltered = 0, False
    for message in records:
        if isinstance(message, Message):
            value = _text(message.headers().get(FILTER_VALUE_HEADER)) if _HEADER_BYTES in message.header else None
        else:
            value = message.filter_value
        if value is not None:
            bloom |= bloom_bits(value)
        else:
            unfiltered = True
    return ChunkFilter(bloom, unfiltered)


class ConsumerFilter:
    __slots__ = ("masks", "match_unfiltered")

    def __init__(self, values: list[str], match_unfiltered: bool) -> None:
        self.masks = [bloom_bits(v) for v in values]
        self.match_unfiltered = match_unfiltered

    def passes(self, chunk: ChunkFilter) -> bool:
        if self.match_unfiltered and chunk.unfiltered:
            return True
        return any(chunk.bloom & mask == mask for mask in self.masks)


def consumer_filter(arguments: dict[str, Any]) -> ConsumerFilter | None:
    value = arguments.get("x-stream-filter")
    texts = [_text(v) for v in value] if isinstance(value, list) and value else [_text(value)]
    if None in texts:
        return None
    return ConsumerFilter(cast("list[str]", texts), arguments.get("x-stream-match-unfiltered") is True)


def protocol_filter(properties: dict[str, str]) -> ConsumerFilter | None:
    """A stream-protocol subscription's filter: ``filter.*`` values, and ``match-unfiltered`` when "true"."""
    values = [value for key, value in properties.items() if key.startswith("filter.")]
    return ConsumerFilter(values, properties.get("match-unfiltered") == "true") if values else None


def _text(value: Any) -> str | None:
    """A string or a long string's bytes as text; None for anything else."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None
