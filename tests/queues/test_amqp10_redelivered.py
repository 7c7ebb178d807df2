"""What ``redelivered`` and ``delivery_tag`` read over AMQP 1.0, by broker (docs/amqp-1.0.md, the mapping): the queue
source driven without Spark on the embedded broker, each RabbitMQ 4.x and ActiveMQ Artemis (``AMQP_TEST_ARTEMIS_URL``).

The brokers mark a message that comes back differently. RabbitMQ sends ``first-acquirer`` true on a first delivery and
false on every later one. Artemis leaves ``first-acquirer`` out (so it is false, the default) on every delivery, and
sends a ``delivery-count`` of 1 when the message comes back after its consumer's connection died without a close, but
only when its failure handling, not its session close, cancels the delivery first (a race inside the broker: 10-12 of
30 such connections here); a release, a link's detach and a clean close leave it out. A row is redelivered when
``first-acquirer`` is sent false or ``delivery-count`` is above 0."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pyarrow as pa
import pytest

from spark_amqp.errors import ConnectionLost
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.options import parse_sink_options

from ..amqp10_fixtures import AMQP10
from ..locks import exclusive
from .driver import MicroBatchDriver

ARTEMIS = os.environ.get("AMQP_TEST_ARTEMIS_URL")
# The Artemis case may first wait for the Artemis lock while the Delta lane's SIGKILL test holds it (over 300 s once).
pytestmark = pytest.mark.timeout(900)

# A connection's delivery ids count from 0, shared by all its links: on RabbitMQ the management node's answer to the
# source's look-up of the queue's type takes id 0 before the first message.
FIRST_TAG = {"rabbitmq": 1, "artemis": 0}


@pytest.fixture(params=["embedded", *(b.name for b in AMQP10), "artemis"])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(uri, the broker's kind): the embedded broker is the kind it models, RabbitMQ."""
    if request.param == "embedded":
        yield request.getfixturevalue("shared_embedded").url, "rabbitmq"
    elif request.param == "artemis":
        if not ARTEMIS:
            pytest.skip("AMQP_TEST_ARTEMIS_URL not set (tools/artemis start; tools/artemis url)")
        with exclusive("artemis"):  # tests/artemis restarts the broker
            yield ARTEMIS, "artemis"
    else:
        yield next(b.url for b in AMQP10 if b.name == request.param), "rabbitmq"


@pytest.fixture
def queue(broker: tuple[str, str]) -> Iterator[str]:
    """A new queue: declared on RabbitMQ; on Artemis the sink's first message makes it (an anycast queue)."""
    url, kind = broker
    name = f"a10r-{uuid.uuid4().hex[:10]}"
    if kind == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare(name, durable=True)
        conn.close()
    yield name
    if kind == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_delete(name)
        conn.close()


def _publish(url: str, queue: str, first: int, count: int) -> None:
    ids = range(first, first + count)
    batch = pa.RecordBatch.from_pydict({"body": [b"m%d" % i for i in ids], "message_id": [f"id-{i}" for i in ids]})
    opts = parse_sink_options({"uri": url, "protocol": "amqp1.0", "routingKey": queue})
    result = asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts)).publish([batch], "test"))
    assert result.confirmed == count


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["message_id"] for r in rows]


def _settle_all(d: MicroBatchDriver) -> None:
    d.idle_until(
        lambda: d.runtime.committed_seq == d.batches and all(le.settled(d.batches) for le in d.runtime.ledgers.values()), timeout=60
    )


def _held(d: MicroBatchDriver, n: int, sessions_lost: int = 0) -> list[bool]:
    """Wait (idle, as Spark) until the source holds ``n`` deliveries in no batch, after ``sessions_lost`` lost
    connections; each one's ``redelivered``, what its row will read."""
    intake = d.runtime.intake
    d.idle_until(lambda: intake.sessions_lost >= sessions_lost and len(intake.buffer) == n, timeout=120)
    return [e.delivery.redelivered for e in intake.buffer]


def _kill_connection(d: MicroBatchDriver) -> None:
    """The source's connection ends without a close, as when its process is killed (the socket just goes)."""
    session = d.runtime.session
    assert session is not None and session._client is not None and session._loop is not None
    session._loop.call_soon_threadsafe(session._client.abort, ConnectionLost("test: the consumer's connection was killed"))


def test_redelivered_and_delivery_tag_read_what_each_broker_sends(broker: tuple[str, str], queue: str) -> None:
    url, kind = broker
    first_tag = FIRST_TAG[kind]
    _publish(url, queue, 0, 10)
    d = MicroBatchDriver(url, queue, protocol="amqp1.0", maxMessagesPerTrigger=10, prefetch=100)
    try:
        rows = d.drain(10, timeout=60)
        assert sorted(_ids(rows)) == [f"id-{i}" for i in range(10)]
        # First deliveries: RabbitMQ sends first-acquirer true, Artemis leaves it out (false): neither is a redelivery.
        assert [r["redelivered"] for r in rows] == [False] * 10
        assert [r["delivery_tag"] for r in rows] == list(range(first_tag, first_tag + 10))
        _settle_all(d)
        _publish(url, queue, 10, 5)
        assert _held(d, 5) == [False] * 5
    finally:
        d.close()  # a clean stop: the five are released, then the connection closed

    d = MicroBatchDriver(url, queue, protocol="amqp1.0", maxMessagesPerTrigger=10, prefetch=100)
    try:
        rows = d.drain(5, timeout=60)
        assert sorted(_ids(rows)) == [f"id-{i}" for i in range(10, 15)]
        # Released: RabbitMQ sends first-acquirer false; Artemis marks nothing (delivery-count 0, left out).
        assert [r["redelivered"] for r in rows] == [kind == "rabbitmq"] * 5
        assert rows[0]["delivery_tag"] == first_tag  # a new connection counts from 0 again
        _settle_all(d)

        _publish(url, queue, 15, 10)
        marked = _held(d, 10)
        assert marked == [False] * 10
        kills = 0
        deadline = time.monotonic() + 400
        while not all(marked):
            # Artemis marks them only when its failure handling wins the race with its session close: kill again
            # (a message once marked stays marked: its delivery-count never goes back to 0).
            assert kind == "artemis" or kills == 0, f"RabbitMQ sent first-acquirer true after a lost connection: {marked}"
            assert kills < 30 and time.monotonic() < deadline, f"Artemis sent no delivery-count after {kills} killed connections"
            _kill_connection(d)
            kills += 1
            marked = _held(d, 10, sessions_lost=kills)
        rows = d.drain(15, timeout=60)[5:]
        assert sorted(_ids(rows)) == [f"id-{i}" for i in range(15, 25)]
        assert [r["redelivered"] for r in rows] == [True] * 10
        assert rows[0]["delivery_tag"] == first_tag
        _settle_all(d)
    finally:
        d.close()
