"""Interop with python-qpid-proton, the reference AMQP 1.0 implementation nobody here wrote: a message it publishes with
every field set is read by the queue source into the row the mapping says (docs/amqp-1.0.md), and a row the sink
publishes reaches it with every field, on the embedded broker, RabbitMQ 4.x and ActiveMQ Artemis. Proton is installed into the main
venv by the Makefile (it builds from its sdist, so not in the test extras the Python 3.13 lane installs)."""

from __future__ import annotations

import asyncio
import datetime
import os
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.option_reader import OptionReader
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.transport.options import CONNECTION_KEYS, parse_connection

from ..brokers import REAL
from ..locks import exclusive
from ..queues.driver import MicroBatchDriver

# The Artemis case may first wait for the Artemis lock while the Delta lane's SIGKILL test holds it (over 300 s once).
pytestmark = pytest.mark.timeout(900)

proton = pytest.importorskip("proton", reason="python-qpid-proton is not installed (make install puts it into .venv)")
from proton import Message, symbol, timestamp  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

ARTEMIS = os.environ.get("AMQP_TEST_ARTEMIS_URL")
NEWEST = max((b for b in REAL if b.version >= (4, 0)), key=lambda b: b.version, default=None)
WHEN = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


@pytest.fixture(params=["embedded", "rabbitmq", "artemis"])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(the connector's uri, the broker's kind): the embedded broker is the kind it models, RabbitMQ."""
    if request.param == "embedded":
        yield request.getfixturevalue("shared_embedded").url, "rabbitmq"
    elif request.param == "rabbitmq":
        if NEWEST is None:
            pytest.skip("no RabbitMQ 4.x in AMQP_TEST_BROKERS")
        yield NEWEST.url, "rabbitmq"
    else:
        if not ARTEMIS:
            pytest.skip("AMQP_TEST_ARTEMIS_URL not set")
        with exclusive("artemis"):  # tests/artemis restarts the broker: an interop test beside it failed so once
            yield ARTEMIS, "artemis"


def _queue(url: str) -> str:
    """A new queue (a sender asking for one makes it on Artemis; RabbitMQ's management node declares it)."""
    name = f"interop-{uuid.uuid4().hex[:10]}"

    async def make() -> None:
        client = await Amqp10Client.connect(parse_connection(OptionReader({"uri": url}, CONNECTION_KEYS)), "interop")
        try:
            if client.rabbitmq:
                status, answer = await client.management_request("PUT", f"/queues/{name}", {"durable": True})
                assert status in (200, 201), answer
            else:
                sender = await client.sender(name, lambda *outcome: None, capability="queue")
                await sender.detach()
        finally:
            await client.close()

    asyncio.run(make())
    return name


def _proton(url: str) -> BlockingConnection:
    parts = urllib.parse.urlsplit(url)
    return BlockingConnection(f"{parts.hostname}:{parts.port}", allowed_mechs="PLAIN", user=parts.username, password=parts.password)


def _address(kind: str, queue: str) -> str:
    return f"/queues/{queue}" if kind == "rabbitmq" else queue


def test_a_message_proton_publishes_is_the_row_the_mapping_says(broker: tuple[str, str]) -> None:
    url, kind = broker
    queue = _queue(url)
    conn = _proton(url)
    try:
        message = Message(
            body=b"proton-body",
            id="p-1",
            user_id=b"guest",
            subject="s",
            reply_to="replies",
            correlation_id="c-1",
            content_type=symbol("application/json"),
            content_encoding=symbol("gzip"),
            creation_time=WHEN.timestamp(),
            group_id="shop",
            durable=True,
            priority=7,
            ttl=60.0,
            properties={"s": "text", "i": 7, "l": 9_000_000_000, "b": True, "d": 1.5, "t": timestamp(int(WHEN.timestamp() * 1000))},
            annotations={symbol("x-basic-type"): "order", symbol("x-custom"): "v"},
        )
        conn.create_sender(_address(kind, queue)).send(message)
    finally:
        conn.close()
    d = MicroBatchDriver(url, queue, protocol="amqp1.0")
    try:
        rows = d.drain(1, timeout=20)
    finally:
        d.close()
    assert len(rows) == 1
    row = rows[0]
    headers = dict(row.pop("headers"))
    expected = {
        "body": b"proton-body",
        "queue": queue,
        "exchange": "",
        "routing_key": queue,
        "delivery_tag": row["delivery_tag"],
        "redelivered": False,
        "message_id": "p-1",
        "correlation_id": "c-1",
        "content_type": "application/json",
        "content_encoding": "gzip",
        "type": "order",
        "app_id": "shop",
        "user_id": "guest",
        "reply_to": "replies",
        "expiration": "60000",
        "priority": 7,
        "delivery_mode": 2,
        "timestamp": WHEN,
        "raw_header": None,
    }
    assert row == expected
    application = {"s": "text", "i": "7", "l": "9000000000", "b": "true", "d": "1.5", "t": "2024-01-02T03:04:05+00:00"}
    assert {k: v for k, v in headers.items() if k in application} == application and headers.get("x-custom") == "v"


def test_a_row_the_sink_publishes_reaches_proton_with_every_field(broker: tuple[str, str]) -> None:
    url, kind = broker
    queue = _queue(url)
    table = {
        "body": [b"sink-body"],
        "message_id": ["m-1"],
        "correlation_id": ["c-1"],
        "content_type": ["application/json"],
        "content_encoding": ["gzip"],
        "type": ["order"],
        "app_id": ["shop"],
        "user_id": ["guest"],
        "reply_to": ["replies"],
        "expiration": ["60000"],
        "priority": [3],
        "delivery_mode": [2],
        "timestamp": [WHEN],
        "headers": pa.array([[("s", "text"), ("n", "7")]], pa.map_(pa.string(), pa.string())),
    }
    opts = parse_sink_options({"uri": url, "protocol": "amqp1.0", "routingKey": queue})
    result = asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts)).publish([pa.RecordBatch.from_pydict(table)], "interop"))
    assert result.confirmed == 1
    conn = _proton(url)
    try:
        receiver = conn.create_receiver(_address(kind, queue))
        got: Any = receiver.receive(timeout=20)
        receiver.accept()
    finally:
        conn.close()
    assert got.body == b"sink-body" and got.id == "m-1" and got.correlation_id == "c-1"
    assert (got.content_type, got.content_encoding) == ("application/json", "gzip")
    assert (got.user_id, got.reply_to, got.group_id) == (b"guest", "replies" if kind == "artemis" else "/queues/replies", "shop")
    assert (got.durable, got.priority, got.ttl) == (True, 3, 60.0)
    assert got.creation_time == WHEN.timestamp() and got.annotations.get("x-basic-type") == "order"
    assert got.properties == {"s": "text", "n": "7"}
