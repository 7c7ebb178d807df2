"""The RabbitMQ nodes whose stream protocol (rabbitmq_stream plugin) the tests reach.

``AMQP_TEST_STREAM_BROKERS`` lists them as ``tools/rabbitmq stream-urls`` prints them
(``3.10=rabbitmq-stream://… 4.3=…``), named as in ``AMQP_TEST_BROKERS`` so that a test can
also reach the same node over AMQP 0-9-1. The embedded broker serves the stream protocol
too, and every test runs on it as well: it must answer as the RabbitMQ line it models.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.option_reader import OptionReader
from spark_amqp.transport.options import ConnectionOptions, parse_connection
from tests.brokers import REAL

STREAM_BROKERS = dict(item.partition("=")[::2] for item in os.environ.get("AMQP_TEST_STREAM_BROKERS", "").split())


def stream_options(url: str, **extra: str) -> ConnectionOptions:
    known = {k.lower(): k for k in ("uri", "password", "connectionTimeout", "heartbeat")}
    return parse_connection(OptionReader({"uri": url, "connectionTimeout": "20", **extra}, known), stream_protocol=True)


@pytest.fixture(params=["embedded", *sorted(STREAM_BROKERS)])
def stream_node(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """(name, stream-protocol url, AMQP 0-9-1 url) of the embedded broker (which answers as RabbitMQ 4.3)
    or of one real node."""
    if request.param == "embedded":
        broker: EmbeddedBroker = request.getfixturevalue("shared_embedded")
        return "embedded", broker.stream_url, broker.url
    amqp = {b.name: b.url for b in REAL}.get(request.param)
    if amqp is None:
        pytest.skip(f"{request.param} is not in AMQP_TEST_BROKERS")
    return request.param, STREAM_BROKERS[request.param], amqp


@pytest.fixture
def stream_name() -> Iterator[str]:
    yield f"sp-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def created_stream(stream_node: tuple[str, str, str], stream_name: str) -> Iterator[str]:
    """A stream declared on ``stream_node`` for the test, and deleted after it."""
    from .helpers import run  # helpers imports this module

    run(stream_node[1], lambda c: c.create(stream_name, {}))
    yield stream_name
    run(stream_node[1], lambda c: c.delete(stream_name))
