"""The AMQP 0-9-1 sink's headers table (``sink.basic_properties``), on both paths (the compiled core's
``basic_headers`` and Python's): a floating-point value keeps its 64 bits and a key all its bytes, delivered so by
every broker of the run and read back so by the queue source (pamqp 4.0 alone writes 32 bits, which read back as
0.10000000149011612, and cuts a key at 128 bytes)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from pamqp import commands, header

from spark_amqp.errors import AmqpOptionError
from spark_amqp.sink.basic_properties import field_table, marshal
from spark_amqp.stream_protocol import core

from ..broker.helpers import connect
from ..queues.driver import MicroBatchDriver
from .helpers import publish_table

LONG_KEY = "k" * 200
FLOATS = [0.1, 1e300, -5e-324, -0.0]
HEADERS_TYPE = pa.map_(pa.string(), pa.float64())


def _headers_column() -> pa.Array:
    return pa.array([[("f", v), (LONG_KEY, v)] for v in FLOATS], HEADERS_TYPE)


@pytest.mark.parametrize("path", ["core", "python"])
def test_floats_keep_64_bits_and_keys_their_bytes_through_the_broker(
    amqp_url: str, names, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    if path == "core" and core.CORE is None:
        pytest.skip(f"no compiled core: {core.PATH}")
    if path == "python":
        monkeypatch.setattr(core, "CORE", None)
    q = names.queue()
    conn = connect(amqp_url)
    conn.channel().queue_declare(q)
    conn.close()
    table = {"body": [b"m%d" % i for i in range(len(FLOATS))], "headers": _headers_column(), "content_type": ["x/y"] * len(FLOATS)}
    result = publish_table(amqp_url, table, routingKey=q)
    assert result.confirmed == len(FLOATS)
    reader = MicroBatchDriver(amqp_url, q)  # the queue source reads 'd' as a double (pika truncates it to an integer)
    try:
        rows = sorted(reader.drain(len(FLOATS)), key=lambda r: r["body"])
    finally:
        reader.close()
    assert [dict(r["headers"]) for r in rows] == [{"f": repr(v), LONG_KEY: repr(v)} for v in FLOATS]
    assert [r["content_type"] for r in rows] == ["x/y"] * len(FLOATS)


@pytest.mark.parametrize("path", ["core", "python"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_header_that_is_not_a_finite_number_fails_before_publishing(
    embedded, path: str, value: float, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """RabbitMQ closes the connection on it (541 INTERNAL_ERROR, 3.10 to 4.3), which a retry would only repeat."""
    if path == "python":
        monkeypatch.setattr(core, "CORE", None)
    headers = pa.array([[("f", 1.5)], [("f", value)]], HEADERS_TYPE)
    with pytest.raises(AmqpOptionError, match=r"column 'headers', row 1 of this partition .*not a finite number"):
        publish_table(embedded.url, {"body": [b"a", b"b"], "headers": headers}, routingKey="nowhere")


def test_the_table_is_pamqps_but_for_floats_and_long_keys() -> None:
    plain = {"s": "text", "i": 7, "big": 2**40, "b": True, "n": None, "x": bytearray(b"\x00"), "l": [1, "a"], "t": {"k": "v"}}
    kwargs = {"content_type": "a/b", "content_encoding": "gzip", "priority": 3, "message_id": "m"}
    pamqps = header.ContentHeader(0, 0, commands.Basic.Properties(**kwargs, headers=dict(plain))).marshal()[12:]
    assert marshal({**kwargs, "headers": dict(plain)}) == pamqps
    floats = {**plain, "f": 0.1, "l": [1, 0.1], "t": {"f": 0.1}, LONG_KEY: 1}
    content = header.ContentHeader()
    content.unmarshal(b"\x00\x3c\x00\x00" + b"\x00" * 8 + marshal({**kwargs, "headers": dict(floats)}))
    decoded = content.properties
    assert (decoded.content_type, decoded.content_encoding, decoded.priority, decoded.message_id) == ("a/b", "gzip", 3, "m")
    assert decoded.headers == floats  # pamqp's own would read 0.10000000149011612 three times, and a key cut at 128
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        field_table({"k" * 256: 1})
