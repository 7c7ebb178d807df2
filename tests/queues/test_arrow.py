from __future__ import annotations

import datetime
import decimal
from typing import Any

import pika
import pyarrow as pa
import pytest

from spark_amqp.queues.inbox import Delivery
from spark_amqp.reading import arrow


def test_header_rendering_rules() -> None:
    r = arrow.render_header
    assert r("text") == "text" and r(True) == "true" and r(7) == "7" and r(decimal.Decimal("1.50")) == "1.50"
    assert r(datetime.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05+00:00"
    assert r(b"utf8 \xc3\xbc") == "utf8 ü" and r(b"\xff\x00") == "base64:/wA="
    assert r({"a": [1, b"x", None]}) == '{"a":[1,"x",null]}'
    assert r(None) is None


def test_record_batch_matches_the_schema_and_values() -> None:
    props = pika.BasicProperties(message_id="m", priority=3, delivery_mode=2, timestamp=1_700_000_000, headers={"h": 1, "n": None})
    rows = [
        Delivery("s.1", "q", 5, True, "x", "rk", props, b"\x00body"),
        Delivery("s.1", "q", 6, False, "", "q", pika.BasicProperties(), b""),
    ]
    batch = arrow.to_record_batch(rows)
    assert batch.schema == arrow.ARROW_SCHEMA
    out = pa.Table.from_batches(list(arrow.from_ipc(arrow.to_ipc(batch)))).to_pylist()
    assert out[0]["body"] == b"\x00body" and out[0]["delivery_tag"] == 5 and out[0]["redelivered"] is True
    assert out[0]["priority"] == 3 and out[0]["delivery_mode"] == 2 and out[0]["message_id"] == "m"
    assert out[0]["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert dict(out[0]["headers"]) == {"h": "1", "n": None}
    assert out[1]["body"] == b"" and out[1]["headers"] is None and out[1]["timestamp"] is None


@pytest.mark.parametrize("bodies", [[], [b""], [b"a", b"", b"bc"], [b"\x00" * 300, b"\xff"]])
def test_a_body_column_is_built_from_its_bytes_and_offsets(bodies: list[bytes]) -> None:
    from spark_amqp.reading.arrow import _binary

    column = _binary(bodies)
    assert column.type == pa.binary() and column.to_pylist() == bodies


def test_the_headers_column_is_what_arrow_makes_of_each_rows_pairs() -> None:
    from spark_amqp.reading.arrow import HEADERS_TYPE, _headers, render_header

    values: list[dict[str, Any] | None] = [None, {}, {"a": 1, "b": None, "c": b"\xff"}, None, {"x": "y"}, None]
    expected = pa.array([None if h is None else [(k, render_header(v)) for k, v in h.items()] for h in values], HEADERS_TYPE)
    assert _headers(values, len(values)).equals(expected)
