"""AMQP 1.0 frames without a broker: what the client writes reads back as the spec says, and a transfer read by
hand reads as the generic decoder reads it (or is left to it)."""

from __future__ import annotations

import struct

import pytest

from spark_amqp.amqp10 import performatives as p
from spark_amqp.amqp10.performatives import Outcome, Performative
from spark_amqp.amqp10.types import Described, Symbol, UInt, encode
from spark_amqp.errors import DecodeError


def _read(frame: bytes) -> p.Frame:
    return p.read_frame(frame, 0, len(frame))


@pytest.mark.parametrize(("handle", "delivery_id", "more"), [(0, 0, False), (7, 255, False), (255, 70_000, True), (300, 2**32 - 1, False)])
def test_a_transfer_reads_by_hand_as_the_generic_decoder_reads_it(handle: int, delivery_id: int, more: bool) -> None:
    frame = p.transfer(handle, delivery_id, b"\x00\x00\x00\x09", b"the message", more=more)
    generic = _read(frame)
    assert generic.code == Performative.TRANSFER and generic.fields[:2] == [handle, delivery_id]
    assert (
        p.read_transfer(frame, 0, len(frame))
        == (handle, delivery_id, more, b"the message")
        == (
            generic.fields[0],
            generic.fields[1],
            len(generic.fields) > 5 and generic.fields[5],
            generic.payload,
        )
    )


@pytest.mark.parametrize(("handle", "delivery_id"), [(0, 0), (255, 70_000), (3, 2**32 - 1)])
def test_a_senders_usual_transfer_is_the_generic_one(handle: int, delivery_id: int) -> None:
    tag = delivery_id.to_bytes(4, "big")
    assert p.usual_transfer(handle, delivery_id, b"the message") == p.transfer(handle, delivery_id, tag, b"the message")
    fields = _read(p.usual_transfer(handle, delivery_id, b"")).fields
    assert fields == [handle, delivery_id, tag, 0, False]


def test_a_transfer_encoded_otherwise_is_left_to_the_generic_decoder() -> None:
    fields = [UInt(1), UInt(2), b"t", UInt(0), False, False, None, None, None, None, True]  # eleven fields: batchable set
    frame = p.frame(0, encode(Described(Performative.TRANSFER, fields)), b"body")
    assert p.read_transfer(frame, 0, len(frame)) is None and _read(frame).payload == b"body"
    large = b"\x00\x53\x14\xd0" + struct.pack(">II", 8, 2) + b"\x52\x01\x52\x02"  # a list with a 32-bit size
    frame = p.frame(0, large, b"body")
    assert p.read_transfer(frame, 0, len(frame)) is None and _read(frame).fields == [1, 2]
    flow = p.flow(1, 2, 3, 4, 0, 0, 10)
    assert p.read_transfer(flow, 0, len(flow)) is None  # not a transfer


def test_a_disposition_settles_a_range_with_one_outcome() -> None:
    frame = _read(p.disposition(10, 1009, Outcome.ACCEPTED))
    assert frame.code == Performative.DISPOSITION and frame.fields[:4] == [True, 10, 1009, True]
    assert frame.fields[4] == Described(Performative.ACCEPTED, [])
    rejected = _read(p.disposition(5, 5, Outcome.rejected("amqp:internal-error", "poison")))
    assert rejected.fields[4] == Described(
        Performative.REJECTED, [Described(Performative.ERROR, [Symbol("amqp:internal-error"), "poison"])]
    )
    assert p.error_of(rejected.fields[4].value, 0) == ("amqp:internal-error", "poison")


def test_a_link_s_attach_and_flow_carry_their_fields_typed() -> None:
    attach = p.attach("r", 3, True, ["/queues/q"], [])
    raw = attach[8:]
    assert raw.startswith(b"\x00\x53\x12") and b"\x52\x03" in raw  # the handle as a uint, not a ulong
    fields = _read(attach).fields
    assert fields[:3] == ["r", 3, True] and fields[5] == Described(Performative.SOURCE, ["/queues/q"])
    flow = _read(p.flow(7, 100, 8, 200, handle=3, delivery_count=12, link_credit=1000, drain=True)).fields
    assert flow[:8] == [7, 100, 8, 200, 3, 12, 1000, None] and flow[8] is True


def test_a_heartbeat_is_an_empty_frame_and_damage_is_refused() -> None:
    assert _read(p.HEARTBEAT).code is None
    with pytest.raises(DecodeError, match="not a described performative"):
        _read(p.FRAME_HEAD.pack(10, 2, 0, 0) + b"\x45\x45")
    broken = p.transfer(1, 1, b"t", b"")[:-3]
    with pytest.raises(DecodeError):
        _read(p.FRAME_HEAD.pack(len(broken), 2, 0, 0) + broken[8:])
