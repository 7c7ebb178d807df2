"""The stream protocol's pieces without a broker: frames, osiris chunks, AMQP 1.0 values and messages."""

from __future__ import annotations

import struct
import uuid

import pytest

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Described, Symbol, Timestamp, decode, encode
from spark_amqp.errors import DecodeError
from spark_amqp.stream_protocol import chunks, wire


def test_reader_reads_what_the_helpers_write_and_stops_at_the_end() -> None:
    body = wire.string("é") + wire.string(None) + wire.strings(["a", "b"]) + wire.map_({"k": "v"})
    r = wire.Reader(body)
    assert (r.string(), r.string(), r.strings(), r.map()) == ("é", None, ["a", "b"], {"k": "v"})
    assert r.at_end
    with pytest.raises(DecodeError, match="ends early"):
        r.u32()


def test_an_array_longer_than_its_frame_is_refused() -> None:
    with pytest.raises(DecodeError, match="array of 1000"):
        wire.Reader(struct.pack(">i", 1000)).strings()


def test_a_request_and_its_response_frame() -> None:
    frame = wire.command(wire.Key.OPEN, 7, wire.string("/"))
    assert struct.unpack_from(">IHHI", frame) == (len(frame) - 4, wire.Key.OPEN, 1, 7)
    reply = wire.response(wire.Key.OPEN, 7, wire.OK)
    assert struct.unpack_from(">IHHIH", reply) == (10, wire.Key.OPEN | wire.RESPONSE, 1, 7, wire.OK)


def test_a_chunk_built_is_read_back_with_its_offsets() -> None:
    chunk = chunks.build(40, [b"a", b"", b"ccc"], 1_700_000_000_000)
    header = chunks.read_header(chunk)
    assert (header.first_offset, header.records, header.next_offset, header.timestamp_ms) == (40, 3, 43, 1_700_000_000_000)
    assert chunks.records(chunk, header) == [b"a", b"", b"ccc"]


def test_a_damaged_chunk_fails_its_crc_before_any_message_is_read() -> None:
    chunk = bytearray(chunks.build(0, [b"hello", b"world"], 0))
    chunk[-1] ^= 0x01
    with pytest.raises(DecodeError, match="CRC"):
        chunks.records(bytes(chunk), chunks.read_header(bytes(chunk)))


def test_a_chunk_cut_short_is_refused() -> None:
    chunk = chunks.build(0, [b"hello"], 0)
    with pytest.raises(DecodeError, match="announced"):
        chunks.records(chunk[:-2], chunks.read_header(chunk))
    with pytest.raises(DecodeError, match="shorter"):
        chunks.read_header(chunk[:20])


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 7, 300, 2**63, -5, 2.5, "", "é" * 200, Symbol("sym"), b"\x00\xff", b"x" * 300,
     Timestamp(1_700_000_000_123), uuid.UUID(int=5), [1, "a", None], {"k": [1, 2]}, {"big": "v" * 300},
     Described(0x75, b"body")],
)  # fmt: skip
def test_amqp10_values_decode_as_they_were_encoded(value: object) -> None:
    data = encode(value)
    decoded, end = decode(data)
    assert (decoded, end) == (value, len(data))
    assert type(decoded) is type(value) or isinstance(value, list | dict)


def test_amqp10_decodes_arrays_and_fixed_width_integers() -> None:
    array = bytes([0xE0, 10, 2, 0x71]) + struct.pack(">ii", 1, -2)
    assert decode(array)[0] == [1, -2]
    assert decode(b"\x61\xff\xfe")[0] == -2
    assert decode(b"\x70\x00\x00\x01\x00")[0] == 256
    with pytest.raises(DecodeError, match="unknown type code"):
        decode(b"\x99")
    with pytest.raises(DecodeError, match="past the end"):
        decode(b"\xa1\x05ab")


def test_a_message_round_trips_through_its_sections() -> None:
    record = amqp10.encode(
        b"body",
        header=[True, 4],
        annotations={Symbol("x-routing-key"): "rk"},
        properties=["id", None, None, None, None, "corr"],
        application_properties={"k": 1},
    )
    parts = amqp10.sections(record)
    assert parts.body == b"body" and parts.header == [True, 4] and parts.annotations == {"x-routing-key": "rk"}
    assert (
        parts.property("message_id") == "id" and parts.property("correlation_id") == "corr" and parts.property("reply_to_group_id") is None
    )
    assert parts.application_properties == {"k": 1}


def test_several_data_sections_make_one_body() -> None:
    record = b"\x00Su\xa0\x03one\x00Su\xa0\x03two"
    assert amqp10.sections(record).body == b"onetwo"


def test_a_record_that_is_not_amqp10_is_recognised() -> None:
    assert not amqp10.is_amqp10(b"hello")
    assert amqp10.is_amqp10(amqp10.encode(b"x"))
    with pytest.raises(DecodeError):
        amqp10.sections(b"\x00Su\xa0\x09cut")
