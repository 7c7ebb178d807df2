"""Osiris chunks, as a ``deliver`` carries them: a 48-byte header, then the data entries.

The layout is osiris_log.erl's. A chunk holds ``records`` messages at offsets
``first_offset`` … ``first_offset + records - 1``. Its data section is a run of
entries: a simple entry is one message (``0 | 31-bit size | bytes``); a sub-batch
entry (``1 | compression | records | uncompressed size | size | bytes``) holds
several, each ``uint32 size | bytes`` once uncompressed. The CRC is CRC-32 over the
data section, so a chunk that came damaged is caught before any of it becomes a row.

A consumer gets user chunks only, without the chunk's Bloom filter or trailer
(osiris sends a data reader's chunks so); a replica's chunks would carry both, and are
skipped over by their sizes.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass

from ..errors import DecodeError

__all__ = ["HEADER", "ChunkHeader", "build", "read_header", "records"]

HEADER = struct.Struct(">BBHIqQQIIII")
MAGIC_VERSION = 0x50  # magic 5, version 0; RabbitMQ 3.13+ writes version 1 (a Bloom filter may follow)
USER = 0
_SIMPLE = struct.Struct(">I")
_SUB_BATCH = struct.Struct(">BHII")
COMPRESSIONS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


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
        kind, count, _uncompressed, size = _SUB_BATCH.unpack_from(data, pos)
        body = bytes(data[pos + 11 : pos + 11 + size])
        pos += 11 + size
        out.extend(_sub_batch(body, (kind >> 4) & 0x7, count, header.first_offset))
    if len(out) != header.records:
        raise DecodeError(f"stream chunk at offset {header.first_offset}: {len(out)} messages where its header says {header.records}")
    return out


def _sub_batch(body: bytes, compression: int, count: int, first: int) -> list[bytes]:
    if compression == 1:
        body = gzip.decompress(body)
    elif compression != 0:
        raise DecodeError(
            f"stream chunk at offset {first}: a sub-batch compressed with {COMPRESSIONS.get(compression, compression)}, which this "
            "connector does not decompress (it reads uncompressed and gzip sub-batches); have the producer use gzip or no compression"
        )
    out = []
    pos = 0
    for _ in range(count):
        (size,) = _SIMPLE.unpack_from(body, pos)
        out.append(body[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def build(first_offset: int, messages: list[bytes], timestamp_ms: int, epoch: int = 1, trailer_length: int = 0) -> bytes:
    """A user chunk of simple entries, as a consumer receives it (the embedded broker's ``deliver``); the
    trailer's length is in the header, but a reader is not sent the trailer itself."""
    data = b"".join(_SIMPLE.pack(len(m)) + m for m in messages)
    head = HEADER.pack(
        MAGIC_VERSION, USER, len(messages), len(messages), timestamp_ms, epoch, first_offset, zlib.crc32(data), len(data), trailer_length, 0
    )
    return head + data
