"""Sub-entries without a broker: every codec RabbitMQ's stream clients write, and what is refused."""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import pytest

from spark_amqp.errors import DecodeError
from spark_amqp.stream_protocol import chunks, compression
from spark_amqp.stream_protocol.compression import CODECS, MAX_UNCOMPRESSED, SUB_ENTRY

MESSAGES = [b"x", b"", b"zzz" * 40, bytes(range(256)) * 300]  # the last one over lz4's and snappy's 64 KiB blocks


def chunk_of(*entries: bytes, first: int = 100, records: int | None = None) -> bytes:
    """A user chunk holding ``entries`` (sub-entries or simple ones), as a subscriber receives it."""
    data = b"".join(entries)
    count = records if records is not None else sum(struct.unpack_from(">H", e, 1)[0] if e[0] & 0x80 else 1 for e in entries)
    return chunks.HEADER.pack(0x51, 0, len(entries), count, 0, 1, first, zlib.crc32(data), len(data), 0, 0) + data


def simple(message: bytes) -> bytes:
    return struct.pack(">I", len(message)) + message


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_round_trips_through_a_chunk(codec: int) -> None:
    entry = compression.encode(codec, MESSAGES)
    assert entry[0] == 0x80 | codec << 4
    chunk = chunk_of(simple(b"before"), entry, simple(b"after"))
    header = chunks.read_header(chunk)
    assert (header.entries, header.records) == (3, len(MESSAGES) + 2)
    assert chunks.records(chunk, header) == [b"before", *MESSAGES, b"after"]


def test_the_framing_is_the_java_clients() -> None:
    plain = b"".join(struct.pack(">I", len(m)) + m for m in MESSAGES)
    blob = {c: compression.encode(c, MESSAGES)[SUB_ENTRY.size :] for c in CODECS}
    assert gzip.decompress(blob[1]) == plain  # a gzip member, not a bare deflate or zlib stream
    assert blob[2][:10] == b"\xff\x06\x00\x00sNaPpY"  # snappy's framing format: its stream identifier first
    assert blob[3][:4] == b"\x04\x22\x4d\x18"  # an LZ4 frame (magic), ...
    assert blob[3][4] & 0x20, "block independence: lz4-java's LZ4FrameInputStream refuses linked blocks"
    assert blob[4][:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    with pytest.raises(Exception):  # noqa: B017 (cramjam's DecompressionError): not raw snappy, not an lz4 block
        cramjam.snappy.decompress_raw(blob[2])
    with pytest.raises(Exception):  # noqa: B017
        cramjam.lz4.decompress_block(blob[3])


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_sub_entry_that_does_not_decompress_to_its_declared_size_is_refused_naming_the_offset(codec: int) -> None:
    entry = bytearray(compression.encode(codec, MESSAGES))
    declared = SUB_ENTRY.unpack_from(entry)[2]
    for wrong in (declared - 1, declared + 1):
        struct.pack_into(">I", entry, 3, wrong)
        chunk = chunk_of(bytes(entry), first=7000)
        with pytest.raises(DecodeError, match=rf"offset 7000: a {CODECS[codec]} sub-entry .*{wrong}"):
            chunks.records(chunk, chunks.read_header(chunk))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_damaged_sub_entry_is_refused(codec: int) -> None:
    entry = compression.encode(codec, MESSAGES)
    cut = entry[: SUB_ENTRY.size + 20]
    damaged = cut[:3] + entry[3:7] + struct.pack(">I", 20) + cut[SUB_ENTRY.size :]  # its size says 20: the data stops short
    chunk = chunk_of(damaged, first=5)
    with pytest.raises(DecodeError, match=rf"offset 5: a {CODECS[codec]} sub-entry does not decompress"):
        chunks.records(chunk, chunks.read_header(chunk))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_sub_entry_declaring_over_64_mib_is_refused_before_anything_is_decompressed(codec: int) -> None:
    entry = bytearray(compression.encode(codec, [b"m"]))
    struct.pack_into(">I", entry, 3, MAX_UNCOMPRESSED + 1)
    chunk = chunk_of(bytes(entry), first=64)
    with pytest.raises(DecodeError, match=r"offset 64: .* declares 67108865 bytes uncompressed, over the limit of 67108864"):
        chunks.records(chunk, chunks.read_header(chunk))
    struct.pack_into(">I", entry, 3, 0xFFFFFFFF)
    chunk = chunk_of(bytes(entry), first=64)
    with pytest.raises(DecodeError, match="4294967295 bytes uncompressed"):
        chunks.records(chunk, chunks.read_header(chunk))


def test_64_mib_itself_is_read() -> None:
    big = b"\x00" * (MAX_UNCOMPRESSED - 4)  # one record of that size: with its 4-byte length, exactly 64 MiB
    entry = compression.encode(4, [big])
    assert SUB_ENTRY.unpack_from(entry)[2] == MAX_UNCOMPRESSED
    assert compression.decode(entry, 0, 0)[0] == [big]


def test_a_sub_entry_with_fewer_records_than_it_counts_is_refused() -> None:
    entry = bytearray(compression.encode(2, [b"a", b"b"]))
    struct.pack_into(">H", entry, 1, 3)
    chunk = chunk_of(bytes(entry), first=9, records=3)
    with pytest.raises(DecodeError, match="offset 9: a snappy sub-entry of 3 records holds fewer"):
        chunks.records(chunk, chunks.read_header(chunk))


def test_a_codec_no_client_writes_is_refused() -> None:
    entry = bytearray(compression.encode(0, [b"a"]))
    entry[0] = 0x80 | 5 << 4
    chunk = chunk_of(bytes(entry), first=3)
    with pytest.raises(DecodeError, match="offset 3: a sub-entry with compression codec 5"):
        chunks.records(chunk, chunks.read_header(chunk))


def test_codec_ids_by_name() -> None:
    assert [compression.codec_id(n) for n in ("none", "gzip", "snappy", "lz4", "zstd")] == [0, 1, 2, 3, 4]
    with pytest.raises(KeyError):
        compression.codec_id("brotli")
