"""Shared fixtures: the brokers under test and unique names.

Broker-facing tests take ``amqp_url``, parametrized over the embedded broker
(always) and a real RabbitMQ (when ``AMQP_TEST_URL`` is set). Fault-injection
tests take ``embedded``, a fresh embedded broker of their own.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator

import pika
import pytest

from spark_amqp.broker import EmbeddedBroker

REAL_URL = os.environ.get("AMQP_TEST_URL")


@pytest.fixture(scope="session")
def shared_embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(heartbeat=60) as broker:
        yield broker


@pytest.fixture(params=["embedded", "rabbitmq"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    if request.param == "rabbitmq" and not REAL_URL:
        pytest.skip("AMQP_TEST_URL not set: real RabbitMQ not available")
    return str(request.param)


# Stream queues arrive in the embedded broker with its stream module; until then the
# stream tests run on RabbitMQ only.
EMBEDDED_STREAMS = importlib.util.find_spec("spark_amqp.broker.stream") is not None


@pytest.fixture
def amqp_url(broker_kind: str, request: pytest.FixtureRequest) -> str:
    if broker_kind == "embedded" and request.node.get_closest_marker("streams") and not EMBEDDED_STREAMS:
        pytest.skip("the embedded broker has no stream queues yet")
    if broker_kind == "embedded":
        broker: EmbeddedBroker = request.getfixturevalue("shared_embedded")
        return broker.url
    assert REAL_URL
    return REAL_URL


@pytest.fixture
def embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        yield broker


@pytest.fixture
def names(amqp_url: str) -> Iterator[NameFactory]:
    factory = NameFactory()
    yield factory
    # Leave a real broker as we found it; the embedded one is discarded anyway.
    if factory.queues or factory.exchanges:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            for q in factory.queues:
                ch = conn.channel()
                ch.queue_delete(q)
                ch.close()
            for x in factory.exchanges:
                ch = conn.channel()
                ch.exchange_delete(x)
                ch.close()
        except pika.exceptions.AMQPError:
            pass
        finally:
            if conn.is_open:
                conn.close()


class NameFactory:
    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, stem: str = "q") -> str:
        name = f"test.{stem}.{self.tag}.{len(self.queues)}"
        self.queues.append(name)
        return name

    def exchange(self, stem: str = "x") -> str:
        name = f"test.{stem}.{self.tag}.{len(self.exchanges)}"
        self.exchanges.append(name)
        return name


@pytest.fixture
def embedded_or_none(broker_kind: str, request: pytest.FixtureRequest) -> EmbeddedBroker | None:
    if broker_kind == "embedded":
        broker: EmbeddedBroker = request.getfixturevalue("shared_embedded")
        return broker
    return None


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for every Spark test (starting one costs ~8 s), with Delta Lake."""
    import sys

    import sparkenv  # examples/sparkenv.py (pythonpath in setup.cfg); Delta's jars come from `make jars`

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need pyarrow and spark_amqp
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyspark
    from pyspark.sql import SparkSession

    # Delta's jars are for the pinned PySpark; other lines (make test-matrix) skip the `delta` tests.
    delta = sparkenv.has_delta_jars_for(pyspark.__version__)

    session = (
        SparkSession.builder.master("local[2,3]")  # 3 task attempts, as on a cluster
        .appName("spark-amqp-tests")
        .config(map=sparkenv.delta_conf() if delta else sparkenv.LOCAL_CONF)  # Delta's jars, SQL extension and catalog
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
