"""Sub-entries: several messages in one entry of a chunk, compressed together, as RabbitMQ's stream clients write them.

A sub-entry is ``1 | codec (3 bits) | 0000``, a 16-bit record count, the uncompressed size and the
size (32 bits each), then the data: each record as ``uint32 size | bytes``, the whole run compressed
as one blob. The codecs and their framing are the Java client's (``DefaultCompressionCodecFactory``),
which the Go and .NET clients match: gzip; snappy in the *framing* format (xerial's
``SnappyFramedOutputStream``), not raw snappy; lz4 in the *frame* format with independent blocks
(``LZ4FrameOutputStream``: lz4-java refuses linked blocks), not an lz4 block; a zstd frame. cramjam
reads and writes all four.

A sub-entry is decompressed into a buffer of its declared size, never more: one that declares more
than ``MAX_UNCOMPRESSED`` (64 MiB, the limit the Java client and RabbitMQ's main branch adopted in
August 2026), or whose data does not decompress to exactly its declared size, is a ``DecodeError``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import cramjam

from ..errors import DecodeError

__all__ = ["CODECS", "MAX_UNCOMPRESSED", "SUB_ENTRY", "codec_id", "decode", "encode"]

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_UNCOMPRESSED = 64 << 20
SUB_ENTRY = struct.Struct(">BHII")  # header byte, records, uncompressed size, size
_SIZE = struct.Struct(">I")
_DECOMPRESS_INTO = {
    1: cramjam.gzip.decompress_into,
    2: cramjam.snappy.decompress_into,
    3: cramjam.lz4.decompress_into,
    4: cramjam.zstd.decompress_into,
}


def codec_id(name: str) -> int:
    """The wire id of a codec by name (``none``, ``gzip``, ``snappy``, ``lz4``, ``zstd``); KeyError if unknown."""
    return {v: k for k, v in CODECS.items()}[name]


def encode(codec: int, records: Sequence[bytes]) -> bytes:
    """One sub-entry holding ``records`` (each an encoded message), compressed with ``codec``."""
    plain = b"".join(_SIZE.pack(len(r)) + r for r in records)
    data = plain if codec == 0 else _compress(codec, plain)
    return SUB_ENTRY.pack(0x80 | codec << 4, len(records), len(plain), len(data)) + data


def _compress(codec: int, plain: bytes) -> bytes:
    if codec == 1:
        return bytes(cramjam.gzip.compress(plain))
    if codec == 2:
        return bytes(cramjam.snappy.compress(plain))  # the framing format
    if codec == 3:
        frame = cramjam.lz4.Compressor(block_linked=False)  # independent blocks: lz4-java reads no other
        frame.compress(plain)
        return bytes(frame.finish())
    return bytes(cramjam.zstd.compress(plain))


def decode(data: bytes | memoryview, pos: int, first_offset: int) -> tuple[list[bytes], int]:
    """The records of the sub-entry at ``data[pos]`` (in a chunk whose first offset is ``first_offset``, for
    errors) and the position after it."""
    kind, count, declared, size = SUB_ENTRY.unpack_from(data, pos)
    codec = (kind >> 4) & 0x7
    start = pos + SUB_ENTRY.size
    blob = data[start : start + size]
    if len(blob) != size:
        raise DecodeError(f"stream chunk at offset {first_offset}: a sub-entry announces {size} bytes, {len(blob)} came")
    if codec == 0:
        plain: bytes | bytearray | memoryview = blob
    else:
        plain = _decompress(codec, blob, declared, first_offset)
    records = []
    at = 0
    try:
        for _ in range(count):
            (length,) = _SIZE.unpack_from(plain, at)
            if at + 4 + length > len(plain):
                raise struct.error("a record runs past the sub-entry")
            records.append(bytes(plain[at + 4 : at + 4 + length]))
            at += 4 + length
    except struct.error:
        raise DecodeError(
            f"stream chunk at offset {first_offset}: a {CODECS.get(codec, codec)} sub-entry of {count} records holds "
            f"fewer ({len(records)} whole)"
        ) from None
    return records, start + size


def _decompress(codec: int, blob: bytes | memoryview, declared: int, first_offset: int) -> bytearray:
    name = CODECS.get(codec)
    into = _DECOMPRESS_INTO.get(codec)
    if name is None or into is None:
        raise DecodeError(f"stream chunk at offset {first_offset}: a sub-entry with compression codec {codec}, which no client writes")
    if declared > MAX_UNCOMPRESSED:
        raise DecodeError(
            f"stream chunk at offset {first_offset}: a {name} sub-entry declares {declared} bytes uncompressed, over the "
            f"limit of {MAX_UNCOMPRESSED} (64 MiB) that RabbitMQ's clients keep; it is not decompressed"
        )
    plain = bytearray(declared)
    try:
        written = into(bytes(blob), plain)
    except Exception as err:  # cramjam's DecompressionError: too much data for the declared size, or damaged
        raise DecodeError(
            f"stream chunk at offset {first_offset}: a {name} sub-entry does not decompress to its declared {declared} bytes ({err})"
        ) from None
    if written != declared:
        raise DecodeError(
            f"stream chunk at offset {first_offset}: a {name} sub-entry decompresses to {written} bytes, not the {declared} it declares"
        )
    return plain
