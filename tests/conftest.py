"""Shared fixtures: the brokers under test and unique names.

Broker-facing tests take ``amqp_url``, parametrized over the embedded broker
(always) and every real RabbitMQ in ``AMQP_TEST_BROKERS`` (or ``AMQP_TEST_URL``;
see ``tests/brokers.py``). Spark tests run on the embedded broker and on the
oldest and the newest real one only: Spark is slow, and what differs between
RabbitMQ lines is covered by the tests without Spark. ``broker_version`` says
which RabbitMQ line the broker of a test behaves as. Fault-injection tests take
``embedded``, a fresh embedded broker of their own.
"""

from __future__ import annotations

import os
import random
import signal
import uuid
from collections.abc import Iterator

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.transport import endpoints
from spark_amqp.transport.endpoints import EndpointOrder

from . import brokers

# Every Spark the tests start listens on loopback: the shared session (sparkenv.LOCAL_CONF binds it there too) and the
# jobs, Spark Connect servers and pipelines that tests start as subprocesses, which inherit this. Where the hostname
# resolves to 127.0.0.1, Spark would otherwise bind to the machine's external interface (tests/spark/test_loopback.py).
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A lane that make or CI stops gets SIGTERM: taken as Ctrl-C, so the fixtures that stopped, drained or cut off a
    # cluster node undo it. Killed without them mid-way through the fault tests, a run left the cluster so that the
    # next run's failover test met a stream with no leader for 133 s.
    signal.signal(signal.SIGTERM, _interrupted)


# The real broker a test that needs one (and only one) uses: the newest.
REAL_URL = brokers.by_version()[-1].url if brokers.REAL else None
_REAL_PARAMS = {f"rabbitmq-{b.name}" if b.name != "rabbitmq" else "rabbitmq": b for b in brokers.REAL}
# Spark tests run on the embedded broker and the newest RabbitMQ: what Spark adds does not depend on the
# broker's line, and the tests without Spark cover every line (each Spark test on a line costs CI time).
_SPARK_PARAMS = {"embedded"} | {p for p, b in _REAL_PARAMS.items() if b is brokers.by_version()[-1]}


@pytest.fixture(scope="session")
def shared_embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(heartbeat=60) as broker:
        yield brokers.note_embedded(broker)


@pytest.fixture(params=["embedded", *_REAL_PARAMS] if _REAL_PARAMS else ["embedded", "rabbitmq"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    if request.param != "embedded" and not _REAL_PARAMS:
        pytest.skip("AMQP_TEST_BROKERS / AMQP_TEST_URL not set: real RabbitMQ not available")
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spark tests, and the stream tests again on the pure-Python path (``read_over`` ``...-python``): the embedded
    broker and the newest RabbitMQ only (deselected elsewhere). The two paths differ in how they decode what a chunk or a
    transfer holds, which the broker's line does not change; tests/stream_protocol/test_core_differential.py and
    tests/queues/test_core_sections.py compare them on every line's conversions."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("broker_kind") if callspec is not None else None
        python_path = callspec is not None and str(callspec.params.get("read_over", "")).endswith("-python")
        if kind is not None and (item.get_closest_marker("spark") or python_path) and kind in _REAL_PARAMS and kind not in _SPARK_PARAMS:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def amqp_url(broker_kind: str, request: pytest.FixtureRequest) -> str:
    if broker_kind == "embedded":
        broker: EmbeddedBroker = request.getfixturevalue("shared_embedded")
        return broker.url
    return _REAL_PARAMS[broker_kind].url


@pytest.fixture
def broker_version(amqp_url: str, embedded_or_none: EmbeddedBroker | None) -> tuple[int, int]:
    """(major, minor) of the RabbitMQ line the test's broker behaves as: tests assert each line's behaviour."""
    return brokers.version(amqp_url, embedded_or_none)


@pytest.fixture
def embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        yield brokers.note_embedded(broker)


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

    # 3 task attempts, as on a cluster. The faults lane gives more task slots than it runs queries (make test), as
    # docs/clusters.md advises: there a query's tasks wait on a broker that does not answer, and with two slots the
    # other queries' tasks waited for them (a query on a silent node failed 60-70 s after its own deadline so).
    master = os.environ.get("SPARK_AMQP_TEST_MASTER", "local[2,3]")
    session = (
        SparkSession.builder.master(master)
        .appName("spark-amqp-tests")
        .config(map=sparkenv.delta_conf() if delta else sparkenv.LOCAL_CONF)  # Delta's jars, SQL extension and catalog
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    _start_a_python_worker(session)
    yield session
    session.stop()


def _start_a_python_worker(session) -> None:  # type: ignore[no-untyped-def]
    """Spark gives each Python worker it starts for a data source 10 s to connect back (not configurable). A session's
    first starts cold, and in CI, beside four other lanes starting their sessions, one missed it (the first query of
    test_databricks_job). Start one here, again while that is how it fails: the tests then start theirs warm."""
    for attempt in range(3):
        try:
            session.read.format("amqp").load()  # the planner's worker refuses it: no uri
        except Exception as err:  # Spark wraps the worker's error in its own
            if "option 'uri' is required" in str(err):
                return
            if "failed to connect back" not in str(err) or attempt == 2:
                raise
            print(f"a Python worker for the session missed Spark's 10 s to connect back (try {attempt + 1}); starting another")
        else:
            raise AssertionError("a read without a uri was accepted")


class Listed(random.Random):
    """A random source that leaves lists as they are."""

    def shuffle(self, x: list[object]) -> None:  # type: ignore[override]
        pass


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Endpoints tried in the order the uri lists them (each connection shuffles them otherwise)."""
    monkeypatch.setattr(endpoints, "ORDER", EndpointOrder(Listed()))
