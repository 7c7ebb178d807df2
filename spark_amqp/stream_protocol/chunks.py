"""Osiris chunks, as a ``deliver`` carries them: a 48-byte header, then the data entries.

The layout is osiris_log.erl's. A chunk holds ``records`` messages at offsets
``first_offset`` … ``first_offset + records - 1``. Its data section is a run of
entries: a simple entry is one message (``0 | 31-bit size | bytes``); a sub-entry
(``1 | codec | records | uncompressed size | size | bytes``, ``compression.py``) holds
several, compressed together. A chunk's ``entries`` counts a sub-entry once, its
``records`` every message in it. The CRC is CRC-32 over the data section, so a chunk
that came damaged is caught before any of it becomes a row.

A consumer gets user chunks only, without the chunk's Bloom filter or trailer
(osiris sends a data reader's chunks so); a replica's chunks would carry both, and are
skipped over by their sizes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ..errors import DecodeError
from . import compression

__all__ = ["HEADER", "ChunkHeader", "build", "build_entries", "entry_spans", "read_header", "records"]

HEADER = struct.Struct(">BBHIqQQIIII")
MAGIC_VERSION = 0x50  # magic 5, version 0; RabbitMQ 3.13+ writes version 1 (a Bloom filter may follow)
USER = 0
_SIMPLE = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    chunk_type: int
    entries: int
    records: int
    timestamp_ms: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.records


def read_header(chunk: bytes | memoryview) -> ChunkHeader:
    if len(chunk) < HEADER.size:
        raise DecodeError(f"a stream chunk of {len(chunk)} bytes is shorter than its {HEADER.size}-byte header")
    magic, ctype, entries, nrecords, ts, epoch, first, crc, size, trailer, bloom = HEADER.unpack_from(chunk)
    if magic >> 4 != 5:
        raise DecodeError(f"not a stream chunk: magic {magic >> 4}, not 5")
    return ChunkHeader(ctype, entries, nrecords, ts, epoch, first, crc, size, trailer, bloom >> 24)


def records(chunk: bytes | memoryview, header: ChunkHeader, check_crc: bool = True) -> list[bytes]:
    """Every message of the chunk, in offset order."""
    start = HEADER.size
    if len(chunk) - start > header.data_length:  # a replica's view: the Bloom filter comes first
        start += header.bloom_size
    end = start + header.data_length
    if end > len(chunk):
        raise DecodeError(
            f"stream chunk at offset {header.first_offset}: {header.data_length} data bytes announced, {len(chunk) - start} came"
        )
    data = chunk[start:end]
    if check_crc and zlib.crc32(data) != header.crc:
        raise DecodeError(
            f"stream chunk at offset {header.first_offset}: CRC {zlib.crc32(data):#010x} does not match its header's {header.crc:#010x}"
        )
    out: list[bytes] = []
    pos = 0
    unpack = _SIMPLE.unpack_from
    for _ in range(header.entries):
        (word,) = unpack(data, pos)
        if word & 0x80000000 == 0:
            out.append(bytes(data[pos + 4 : pos + 4 + word]))
            pos += 4 + word
            continue
        inside, pos = compression.decode(data, pos, header.first_offset)
        out.extend(inside)
    if len(out) != header.records:
        raise DecodeError(f"stream chunk at offset {header.first_offset}: {len(out)} messages where its header says {header.records}")
    return out


def entry_spans(chunk: bytes | memoryview, header: ChunkHeader) -> list[tuple[int, int, int | None]]:
    """Each entry's first offset, its record count and its codec (None for a simple entry), read from the
    entries' heads alone: nothing is decompressed."""
    start = HEADER.size + (header.bloom_size if len(chunk) - HEADER.size > header.data_length else 0)
    data = chunk[start : start + header.data_length]
    spans: list[tuple[int, int, int | None]] = []
    offset, pos = header.first_offset, 0
    for _ in range(header.entries):
        (word,) = _SIMPLE.unpack_from(data, pos)
        if word & 0x80000000 == 0:
            spans.append((offset, 1, None))
            offset, pos = offset + 1, pos + 4 + word
            continue
        kind, count, _plain, size = compression.SUB_ENTRY.unpack_from(data, pos)
        spans.append((offset, count, (kind >> 4) & 0x7))
        offset, pos = offset + count, pos + compression.SUB_ENTRY.size + size
    return spans


def build(first_offset: int, messages: list[bytes], timestamp_ms: int, epoch: int = 1, trailer_length: int = 0) -> bytes:
    """A user chunk of simple entries, as a consumer receives it (the embedded broker's ``deliver``); the
    trailer's length is in the header, but a reader is not sent the trailer itself."""
    return build_entries(first_offset, [(_SIMPLE.pack(len(m)) + m, 1) for m in messages], timestamp_ms, epoch, trailer_length)


def build_entries(first_offset: int, entries: list[tuple[bytes, int]], timestamp_ms: int, epoch: int = 1, trailer_length: int = 0) -> bytes:
    """A user chunk of encoded entries, each with the records it holds: a simple entry (its size, then the
    message) holds one, a sub-entry (``compression.encode``) several."""
    data = b"".join(entry for entry, _ in entries)
    records = sum(n for _, n in entries)
    head = HEADER.pack(
        MAGIC_VERSION, USER, len(entries), records, timestamp_ms, epoch, first_offset, zlib.crc32(data), len(data), trailer_length, 0
    )
    return head + data
