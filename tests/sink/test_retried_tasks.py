"""Spark's retry of a sink task that reaches no broker: its earlier attempt waited out brokerOutageTimeout since the
task was planned, so the retry does not wait it again, and its error says why it gave up at once.

Seen in CI (the Spark test of a broker that never answers, PySpark 4.1 on Python 3.13): a retry planned just under
the deadline ago gave up at its first refusal, because the next delay would pass the deadline, and its error
said only "connection refused ... the task fails so that Spark retries it", as if more retries could help."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pyarrow as pa
import pytest

from spark_amqp.errors import AmqpPublishError
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.publisher import PartitionPublisher
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher

DEADLINE = 8.0
BATCH = pa.RecordBatch.from_pydict({"body": [b"a", b"b"]})


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed: every connection is refused


def publish(kind: str, retried_since: float) -> None:
    port = refused_port()
    common = {"connectionTimeout": "2", "brokerOutageTimeout": f"{DEADLINE:g}s"}
    if kind == "stream":
        opts = parse_sink_options({"uri": f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/", "stream": "s", **common})
        producer = producer_for("test-" + uuid.uuid4().hex, 0, None)
        asyncio.run(StreamPartitionPublisher(opts, producer, retried_since).publish([BATCH]))
    elif kind == "amqp":
        opts = parse_sink_options({"uri": f"amqp://guest:guest@127.0.0.1:{port}/", "routingKey": "q", **common})
        asyncio.run(PartitionPublisher(opts, retried_since).publish([MessageBuilder(opts).messages(BATCH)], "test"))
    else:
        opts = parse_sink_options({"uri": f"amqp://guest:guest@127.0.0.1:{port}/", "routingKey": "q", "protocol": "amqp1.0", **common})
        asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts), retried_since).publish([BATCH], "test"))


@pytest.mark.parametrize("kind", ["amqp", "stream", "amqp1.0"])
@pytest.mark.parametrize("planned_ago", [DEADLINE - 0.1, DEADLINE + 30], ids=["just-under-the-deadline", "long-ago"])
def test_a_retried_task_that_reaches_no_broker_gives_up_at_once_and_says_why(kind: str, planned_ago: float) -> None:
    began = time.monotonic()
    with pytest.raises(AmqpPublishError) as raised:
        publish(kind, time.time() - planned_ago)
    took = time.monotonic() - began
    message = str(raised.value)
    assert "connection refused" in message and "guest:" not in message, message
    assert "this is Spark's retry of a task planned" in message, message
    assert f"brokerOutageTimeout={DEADLINE:g}s), so this one does not wait again" in message, message
    assert "nothing was published" in message, message
    assert took < DEADLINE / 2, took  # not a wait of its own: the earlier attempt had waited
