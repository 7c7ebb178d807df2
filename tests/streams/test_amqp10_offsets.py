"""A stream delivery's offset over AMQP 1.0, without a broker: read from its x-stream-offset annotation in every width
RabbitMQ (and the standard) may write it, and the message with that value zeroed, so that the sections before the
body are the same from one delivery to the next and are decoded once."""

from __future__ import annotations

import pytest

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Opaque, Symbol
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from spark_amqp.streams.range_over_amqp10 import _stream_offset


def _delivery(value: object, body: bytes = b"m") -> bytes:
    annotations = {Symbol("x-stream-offset"): value, Symbol("x-exchange"): "", Symbol("x-routing-key"): "s"}
    return amqp10.encode(body, header=[True], annotations=annotations, properties=["id"])


@pytest.mark.parametrize(
    ("encoded", "offset"),
    [
        (Opaque(0x55, b"\x05"), 5),  # small long: RabbitMQ below 128
        (Opaque(0x81, (200).to_bytes(8, "big")), 200),  # long: RabbitMQ from 128
        (Opaque(0x53, b"\x07"), 7),
        (Opaque(0x80, (2**40).to_bytes(8, "big")), 2**40),
        (Opaque(0x44, b""), 0),
        (Opaque(0x71, (9).to_bytes(4, "big")), 9),  # an int: read by decoding the sections
    ],
)
def test_every_width_of_the_offset(encoded: Opaque, offset: int) -> None:
    found, _ = _stream_offset(_delivery(encoded))
    assert found == offset


def test_deliveries_differ_only_in_their_offset_after_it_is_zeroed() -> None:
    first = _stream_offset(_delivery(Opaque(0x81, (1000).to_bytes(8, "big"))))[1]
    second = _stream_offset(_delivery(Opaque(0x81, (1001).to_bytes(8, "big"))))[1]
    assert first == second
    rows = RowMaker("s", Conversion.of((4, 3)))
    row = rows.row(first, 1000)
    assert row[0] == b"m" and row[4] == 1000 and row[5].message_id == "id" and "x-stream-offset" not in (row[5].headers or {})


def test_a_message_without_the_annotation_is_none() -> None:
    assert _stream_offset(amqp10.encode(b"x"))[0] is None
