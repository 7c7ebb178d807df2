"""What the AMQP 1.0 broker tests share: a client session on a url, publishing with outcomes, reading with credit,
and the brokers they run on (the embedded broker and RabbitMQ 4.3, the line it models; 4.0 where the behaviour is
the same on every 4.x)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pika
import pytest

from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.amqp10_client.links import Receiver
from spark_amqp.option_reader import OptionReader
from spark_amqp.transport.options import CONNECTION_KEYS, parse_connection

from ..brokers import EMBEDDED, REAL
from ..stream_protocol.helpers import until

NEWEST = [b for b in REAL if b.version >= (4, 3)]


@pytest.fixture(params=["embedded", *(f"rabbitmq-{b.name}" for b in NEWEST)])
def url(request: pytest.FixtureRequest) -> str:
    """The embedded broker, and RabbitMQ 4.3 (what it models) when the run has it."""
    if request.param == "embedded":
        return str(request.getfixturevalue("shared_embedded").url)
    return next(b.url for b in NEWEST if f"rabbitmq-{b.name}" == request.param)


def embedded(url: str) -> bool:
    return url in EMBEDDED


def declare(url: str, kind: str = "classic", **arguments: Any) -> str:
    name = f"b10-{uuid.uuid4().hex[:10]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": kind, **arguments})
    conn.close()
    return name


def delete(url: str, *queues: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    for q in queues:
        conn.channel().queue_delete(q)
    conn.close()


def run(url: str, body: Callable[[Amqp10Client], Awaitable[Any]], **options: str) -> Any:
    async def main() -> Any:
        opts = parse_connection(OptionReader({"uri": url, "connectionTimeout": "10", **options}, CONNECTION_KEYS))
        client = await Amqp10Client.connect(opts, "broker-test")
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


async def publish(client: Amqp10Client, address: str | None, messages: list[bytes]) -> list[tuple[int, list[Any]]]:
    """Each message's outcome: (descriptor code, its fields)."""
    outcomes: dict[int, tuple[int, list[Any]]] = {}

    def heard(first: int, last: int, code: int, values: list[Any]) -> None:
        for i in range(first, last + 1):
            outcomes[i] = (code, values)

    sender = await client.sender(address, heard)
    ids = []
    for m in messages:
        await until(lambda: sender.credit > 0)
        ids.append(sender.send(m))
    await until(lambda: len(outcomes) == len(messages))
    await sender.detach()
    return [outcomes[i] for i in ids]


async def read(
    client: Amqp10Client, address: str, n: int, filters: dict[Any, Any] | None = None
) -> tuple[Receiver, list[tuple[int, bytes]]]:
    """A receiver with credit ``n`` and the ``n`` deliveries it got (left unsettled)."""
    got: list[tuple[int, bytes]] = []
    receiver = await client.receiver(address, lambda d, payload: got.append((d, payload)), filters)
    receiver.grant(n)
    await until(lambda: len(got) >= n)
    return receiver, got
