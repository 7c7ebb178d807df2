"""AMQP -> Delta under SIGKILL and dropped connections: exactly once with the journal, at least once without.

Real RabbitMQ when ``AMQP_TEST_URL`` is set (CI), else the embedded broker.
Each query run is a subprocess (``crash_job.py``) in its own process group,
killed with SIGKILL and restarted from the same checkpoint (and journal); the
last run uses Trigger.AvailableNow to finish what is left.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from .. import brokers
from ..broker.helpers import wait_for
from ..brokers import counts, drop_source_connections
from ..conftest import REAL_URL, NameFactory
from .crash_jobs import TIMEOUT, Budget, Job, kill_between_delta_commit_and_commit_log, last_delta_batch, message_ids, offsets_logged

# Each test starts several Spark jobs, and its waits share one Budget (crash_jobs.py says why these numbers).
pytestmark = [pytest.mark.spark, pytest.mark.delta, pytest.mark.timeout(TIMEOUT)]

MESSAGES = 3000


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[str, EmbeddedBroker | None]]:
    if REAL_URL:
        yield REAL_URL, None
    else:
        with EmbeddedBroker(heartbeat=60, consumer_timeout_ms=None) as embedded:
            yield embedded.url, embedded


@pytest.fixture
def names_plain(broker) -> Iterator[NameFactory]:  # type: ignore[no-untyped-def]
    factory = NameFactory()
    yield factory
    conn = pika.BlockingConnection(pika.URLParameters(broker[0]))
    for q in factory.queues:
        conn.channel().queue_delete(q)
    conn.close()


def _publish(url: str, queue: str, count: int, pause: float) -> threading.Thread:
    """Messages m-00000 ... with confirms, pausing every 50: a publisher still running through the kills."""

    def run() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, f"payload {i}".encode(), pika.BasicProperties(message_id=f"m-{i:05d}"))
            if i % 50 == 49:
                time.sleep(pause)
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _declare(url: str, queue: str, **arguments: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(queue, durable=True, arguments=arguments or None)
    conn.close()


def _kill_and_finish(
    url: str, queue: str, work: Path, journal: bool, publisher: threading.Thread, rng: random.Random | None, budget: Budget
) -> None:
    """SIGKILL the query once between a Delta commit and the commit log, once at a random moment while
    batches run (unless ``rng`` is None), then finish what is left with an AvailableNow run. (One random kill,
    not two: each costs a JVM start, about 25 s of CI time.)"""
    kill_between_delta_commit_and_commit_log(url, queue, work, journal, budget)
    if rng is not None:
        job = Job(url, queue, work, journal)
        planned = offsets_logged(work)
        wait_for(lambda: offsets_logged(work) > planned, timeout=budget.left(180))
        time.sleep(rng.uniform(0.0, 2.0))  # a random moment while batches run
        job.kill()
    publisher.join(budget.left(120))
    assert not publisher.is_alive()
    final = Job(url, queue, work, journal, "--available-now")
    assert final.wait(budget.left(300)) == 0, final.output()[-3000:]


def _expected() -> set[str]:
    return {f"m-{i:05d}" for i in range(MESSAGES)}


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_sigkill_restarts(spark, broker, names_plain, tmp_path: Path, journal: bool) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    queue = names_plain.queue("crash")
    _declare(url, queue)
    budget = Budget()
    publisher = _publish(url, queue, MESSAGES, pause=0.5)  # ~100 msg/s: still publishing through the first kills
    # Without the journal, the first kill is what shows at-least-once (a replayed batch): no random one.
    rng = random.Random(5) if journal else None

    _kill_and_finish(url, queue, tmp_path, journal, publisher, rng, budget)

    ids = message_ids(spark, tmp_path / "table")
    assert set(ids) == _expected()  # at least once, either way
    duplicated = [i for i, n in ids.items() if n > 1]
    if journal:
        assert duplicated == []  # and exactly once with the journal
    else:
        # Without it, the batch Delta committed just before the first kill is replayed empty
        # and its messages come back from the broker: they are written twice.
        assert duplicated
    assert wait_for(lambda: counts(url, queue, embedded) == (0, 0), timeout=30)


@pytest.mark.skipif(not REAL_URL or brokers.version(REAL_URL) < (4, 0), reason="AMQP 1.0 needs RabbitMQ 4.x (AMQP_TEST_BROKERS)")
def test_sigkill_restarts_over_amqp_1_0_exactly_once_with_the_journal(spark, broker, names_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = broker
    queue = names_plain.queue("amqp10")  # crash_jobs.Job reads it with protocol=amqp1.0
    _declare(url, queue, **{"x-queue-type": "quorum"})
    budget = Budget()
    publisher = _publish(url, queue, MESSAGES, pause=0.5)

    _kill_and_finish(url, queue, tmp_path, True, publisher, random.Random(11), budget)

    ids = message_ids(spark, tmp_path / "table")
    assert set(ids) == _expected() and max(ids.values()) == 1
    assert wait_for(lambda: counts(url, queue, None) == (0, 0), timeout=30)


def test_connection_drops_during_batches(spark, broker, names_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    queue = names_plain.queue("drop")
    _declare(url, queue)
    budget = Budget()
    publisher = _publish(url, queue, MESSAGES, pause=0)
    publisher.join(budget.left(120))
    assert not publisher.is_alive()
    job = Job(url, queue, tmp_path, True, "--available-now", "--max-per-trigger", "300")
    job.wait_started(budget.left(180))
    dropped = 0
    for _ in range(3):
        wait_for(lambda: last_delta_batch(tmp_path / "table") is not None, timeout=budget.left(120))
        time.sleep(1.0)  # spreads the drops over the run's batches
        dropped += drop_source_connections(url, embedded)
    assert job.wait(budget.left(300)) == 0, job.output()[-3000:]
    assert dropped >= 2, "the connections were not dropped while the query ran"
    ids = message_ids(spark, tmp_path / "table")
    assert set(ids) == _expected() and max(ids.values()) == 1
    assert wait_for(lambda: counts(url, queue, embedded) == (0, 0), timeout=30)


@pytest.mark.streams
def test_stream_sigkill_restarts_exactly_once_without_a_journal(spark, broker, names_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = broker
    stream = names_plain.queue("stream")
    _declare(url, stream, **{"x-queue-type": "stream"})
    budget = Budget()
    publisher = _publish(url, stream, MESSAGES, pause=0.5)
    rng = random.Random(7)

    _kill_and_finish(url, stream, tmp_path, False, publisher, rng, budget)

    ids = message_ids(spark, tmp_path / "table")
    # A replayed batch re-reads the same offsets, so Delta skips or writes it whole: exactly once.
    assert set(ids) == _expected() and max(ids.values()) == 1
    offsets = sorted(r.offset for r in spark.read.format("delta").load(str(tmp_path / "table")).select("offset").collect())
    assert offsets == list(range(MESSAGES))
