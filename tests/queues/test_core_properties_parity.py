"""Both paths of the queue source's property columns give identical Arrow data on what real publishers send: pika
(every property, headers of each type it writes), the connector's own sink, and a raw client's poison values, through
the embedded broker and every node in AMQP_TEST_BROKERS, read by the queue source (``MicroBatchDriver``). Each batch
the source plans is made twice where it is made (``arrow.to_record_batch``): first by the compiled core, then on the
pure-Python path from fresh copies of the same content headers; the tables must be equal, and the core must have taken
every batch but those with a nested table or a decimal (not left them all to Python, which would make the comparison
empty)."""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

import pika
import pyarrow as pa
import pytest

from spark_amqp.client.properties import LazyProperties
from spark_amqp.reading import arrow
from spark_amqp.stream_protocol import core

from ..sink.helpers import publish_table
from .driver import MicroBatchDriver
from .test_poison import _publish_raw

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

N = 120
WHEN = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _by_pika(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for i in range(N):
        headers: dict[str, Any] = {"tenant": f"t{i % 7}", "attempt": i - 3, "vip": i % 2 == 0, "when": WHEN}
        headers |= {"raw": b"\x00\xff", "text": "ü".encode(), "none": None, "big": 2**40 + i}
        if i % 40 == 1:  # Python's alone: the batch holding it goes to the Python path whole
            headers |= {"nested": {"a": [1, "b"]}, "price": decimal.Decimal("9.95")}
        props = pika.BasicProperties(
            message_id=f"msg-{i:06d}",
            correlation_id=f"corr-{i // 4}",
            content_type="application/json",
            content_encoding="utf-8" if i % 3 else None,
            timestamp=int(WHEN.timestamp()) + i,
            type="order" if i % 2 else None,
            app_id="shop",
            user_id="guest" if i % 5 == 0 else None,
            reply_to="replies" if i % 4 == 0 else None,
            expiration="600000" if i % 6 == 0 else None,
            delivery_mode=2 if i % 5 else 1,
            priority=i % 10 if i % 7 else None,
            headers=headers if i % 11 else None,
        )
        ch.basic_publish("", queue, b'{"i": %d}' % i, props)
    conn.close()


def _by_sink(url: str, queue: str) -> None:
    table = {
        "body": [b"s%d" % i for i in range(N)],
        "message_id": [f"sink-{i}" for i in range(N)],
        "correlation_id": [None if i % 3 else f"c{i}" for i in range(N)],
        "priority": [i % 10 for i in range(N)],
        "timestamp": [WHEN + datetime.timedelta(seconds=i) for i in range(N)],
        "headers": [[("k", str(i)), ("tenant", f"t{i % 4}")] if i % 5 else None for i in range(N)],
        "type": ["t"] * N,
        "app_id": ["spark"] * N,
    }
    result = publish_table(url, table, routingKey=queue)
    assert result.confirmed == N


def _poison(url: str, queue: str) -> None:
    bad_id = struct.pack(">HHQH", 60, 0, 1, 1 << 7) + b"\x02\xff\xfe"
    late = struct.pack(">HHQH", 60, 0, 1, 1 << 6) + struct.pack(">Q", 2**63)
    _publish_raw(url, queue, [bad_id, late])


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the core took each batch the source made; each one checked against the Python path's."""
    real = arrow.to_record_batch
    taken: list[bool] = []

    def both(rows: Any, projection: Any = None) -> pa.RecordBatch:
        copies = [(*r[:6], LazyProperties(r[6].header), *r[7:]) for r in rows]  # before the core's path decodes nothing
        wanted = list(arrow.PROPERTY_COLUMNS if projection is None else projection.properties)
        taken.append(bool(wanted) and core.CORE.basic_properties([r[6].header for r in rows], wanted) is not None)
        got = real(rows, projection)
        saved = core.CORE
        core.CORE = None
        try:
            want = real(copies, projection)
        finally:
            core.CORE = saved
        got.validate(full=True)
        assert got.equals(want), f"{got.to_pylist()}\n!=\n{want.to_pylist()}"
        return got

    monkeypatch.setattr(arrow, "to_record_batch", both)
    return taken


@pytest.mark.parametrize("publisher", [_by_pika, _by_sink])
def test_the_core_and_python_make_the_same_columns_of_what_publishers_send(amqp_url: str, names, compared, publisher) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(q)
    conn.close()
    publisher(amqp_url, q)
    _poison(amqp_url, q)
    d = MicroBatchDriver(amqp_url, q, connectionTimeout=30)
    try:
        rows = d.drain(N + 2, max_rows=16)
    finally:
        d.close()
    assert len(rows) == N + 2
    assert rows[-1]["raw_header"] is not None and rows[-1]["timestamp"] is None
    # Poison short strings and timestamps are the core's too; pika's nested tables and decimals are Python's.
    assert all(compared) if publisher is _by_sink else any(compared) and not all(compared), compared
