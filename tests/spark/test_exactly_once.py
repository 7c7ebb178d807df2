"""AMQP -> Delta under SIGKILL and dropped connections: exactly once with the journal, at least once without.

Real RabbitMQ when ``AMQP_TEST_URL`` is set (CI), else the embedded broker.
Each query run is a subprocess (``crash_job.py``) in its own process group,
killed with SIGKILL and restarted from the same checkpoint (and journal); the
last run uses Trigger.AvailableNow to finish what is left.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from spark_amqp.broker import EmbeddedBroker

from ..broker.helpers import wait_for
from ..brokers import counts, drop_source_connections
from ..conftest import REAL_URL, NameFactory

# Each test starts several Spark jobs; on a loaded 2-core machine one can take minutes. The
# waits below add up to less than this (at most 3 x 200 + 2 x 182 + 120 + 300 + 30 s).
pytestmark = [pytest.mark.spark, pytest.mark.delta, pytest.mark.timeout(1800)]

JOB = Path(__file__).with_name("crash_job.py")
ROOT = JOB.parent.parent.parent
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


class Job:
    """One run of the query: a process group we can SIGKILL whole."""

    def __init__(self, url: str, queue: str, work: Path, journal: bool, *flags: str) -> None:
        if queue.startswith("test.stream."):
            flags = ("--stream", *flags)
        args = [sys.executable, str(JOB), "--uri", url, "--queue", queue, "--table", str(work / "table")]
        args += ["--checkpoint", str(work / "checkpoint"), *flags]
        if journal:
            args += ["--journal", str(work / "journal")]
        runs = len(list(work.glob("run-*.log")))
        self.log = work / f"run-{runs}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_started(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while "STARTED" not in self.output():
            assert self.proc.poll() is None, f"the job exited early:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"the job did not start:\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not finish within {timeout}s:\n{self.output()[-3000:]}") from None


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


def _last_delta_batch(table: Path) -> int | None:
    """The streaming batch id Delta's newest commit recorded (its txn action)."""
    logs = sorted((table / "_delta_log").glob("*.json"))
    if not logs:
        return None
    for line in logs[-1].read_text().splitlines():
        action = json.loads(line)
        if "txn" in action:
            return int(action["txn"]["version"])
    return None


def _kill_between_delta_commit_and_commit_log(url: str, queue: str, work: Path, journal: bool) -> None:
    for _attempt in range(3):
        job = Job(url, queue, work, journal, "--kill-after-delta-commit")
        code = job.wait(200)
        assert code == -signal.SIGKILL, job.output()[-3000:]
        batch = _last_delta_batch(work / "table")
        if batch is not None and not (work / "checkpoint" / "commits" / str(batch)).exists():
            return  # Delta has batch N, Spark's commit log does not: the window was hit
    raise AssertionError("never killed inside the window between the Delta commit and the commit log")


def _kill_and_finish(url: str, queue: str, work: Path, journal: bool, publisher: threading.Thread, rng: random.Random) -> None:
    """SIGKILL the query once between a Delta commit and the commit log, once at a random moment while
    batches run, then finish what is left with an AvailableNow run. (One random kill, not two: each costs a
    JVM start, about 25 s of CI time for each of the three tests that call this.)"""
    _kill_between_delta_commit_and_commit_log(url, queue, work, journal)
    job = Job(url, queue, work, journal)
    planned = _offsets_logged(work)
    wait_for(lambda: _offsets_logged(work) > planned, timeout=180)
    time.sleep(rng.uniform(0.0, 2.0))
    job.kill()
    publisher.join(120)
    assert not publisher.is_alive()
    final = Job(url, queue, work, journal, "--available-now")
    assert final.wait(300) == 0, final.output()[-3000:]


def _offsets_logged(work: Path) -> int:
    return len(list((work / "checkpoint" / "offsets").glob("[0-9]*")))


def _ids(spark, table: Path) -> collections.Counter[str]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("delta").load(str(table)).select("message_id").collect()
    return collections.Counter(r.message_id for r in rows)


def _expected() -> set[str]:
    return {f"m-{i:05d}" for i in range(MESSAGES)}


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_sigkill_restarts(spark, broker, names_plain, tmp_path: Path, journal: bool) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    queue = names_plain.queue("crash")
    _declare(url, queue)
    publisher = _publish(url, queue, MESSAGES, pause=0.5)  # ~100 msg/s: still publishing through the first kills
    rng = random.Random(5)

    _kill_and_finish(url, queue, tmp_path, journal, publisher, rng)

    ids = _ids(spark, tmp_path / "table")
    assert set(ids) == _expected()  # at least once, either way
    duplicated = [i for i, n in ids.items() if n > 1]
    if journal:
        assert duplicated == []  # and exactly once with the journal
    else:
        # Without it, the batch Delta committed just before the first kill is replayed empty
        # and its messages come back from the broker: they are written twice.
        assert duplicated
    assert wait_for(lambda: counts(url, queue, embedded) == (0, 0), timeout=30)


def test_connection_drops_during_batches(spark, broker, names_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    queue = names_plain.queue("drop")
    _declare(url, queue)
    _publish(url, queue, MESSAGES, pause=0).join(120)
    job = Job(url, queue, tmp_path, True, "--available-now", "--max-per-trigger", "300")
    job.wait_started()
    dropped = 0
    for _ in range(3):
        wait_for(lambda: _last_delta_batch(tmp_path / "table") is not None, timeout=120)
        time.sleep(1.0)
        dropped += drop_source_connections(url, embedded)
    assert job.wait(300) == 0, job.output()[-3000:]
    assert dropped >= 2, "the connections were not dropped while the query ran"
    ids = _ids(spark, tmp_path / "table")
    assert set(ids) == _expected() and max(ids.values()) == 1
    assert wait_for(lambda: counts(url, queue, embedded) == (0, 0), timeout=30)


@pytest.mark.streams
def test_stream_sigkill_restarts_exactly_once_without_a_journal(spark, broker, names_plain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = broker
    stream = names_plain.queue("stream")
    _declare(url, stream, **{"x-queue-type": "stream"})
    publisher = _publish(url, stream, MESSAGES, pause=0.5)
    rng = random.Random(7)

    _kill_and_finish(url, stream, tmp_path, False, publisher, rng)

    ids = _ids(spark, tmp_path / "table")
    # A replayed batch re-reads the same offsets, so Delta skips or writes it whole: exactly once.
    assert set(ids) == _expected() and max(ids.values()) == 1
    offsets = sorted(r.offset for r in spark.read.format("delta").load(str(tmp_path / "table")).select("offset").collect())
    assert offsets == list(range(MESSAGES))
