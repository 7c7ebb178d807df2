"""Fixtures of the AMQP 1.0 tests (queue source and sink): the embedded broker (which serves AMQP 1.0 as RabbitMQ 4.3
does) and each RabbitMQ 4.x in the run, and fresh queues on it, deleted after the test. A test module takes them with
``from ..amqp10_fixtures import queues, url``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from .brokers import EMBEDDED, REAL

AMQP10 = [b for b in REAL if b.version >= (4, 0)]  # AMQP 1.0 is a core protocol of RabbitMQ from 4.0

__all__ = ["AMQP10", "is_embedded", "queues", "url"]


@pytest.fixture(params=["embedded", *(b.name for b in AMQP10)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "embedded":
        return str(request.getfixturevalue("shared_embedded").url)
    return next(b.url for b in AMQP10 if b.name == request.param)


def is_embedded(url: str) -> bool:
    """Whether ``url`` is an embedded broker's (what it does not model is skipped there, saying why)."""
    return url in EMBEDDED


@pytest.fixture
def queues(url: str) -> Iterator[Callable[..., str]]:
    """``make(kind="classic", **arguments)``: a new durable queue of that type (``x-queue-type``) and arguments."""
    made: list[str] = []

    def make(kind: str = "classic", **arguments: Any) -> str:
        name = f"a10-{uuid.uuid4().hex[:10]}"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": kind, **arguments})
        conn.close()
        made.append(name)
        return name

    yield make
    conn = pika.BlockingConnection(pika.URLParameters(url))
    for name in made:
        conn.channel().queue_delete(name)
    conn.close()
