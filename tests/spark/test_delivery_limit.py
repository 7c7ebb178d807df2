"""A quorum queue's delivery-limit under a query that keeps dying: nothing lost, on RabbitMQ 4.x.

RabbitMQ 4.x drops a quorum queue's message returned more than 20 times (its
default delivery-limit; no dead-letter exchange here). The messages are first
aged with pika to x-delivery-count 19: two more returns and they are gone. Then
the crash job (tests/spark/crash_job.py) reads them into Delta and is killed
with SIGKILL twice, once between the Delta commit and Spark's commit log and
once at a random moment. With a journal every message must reach the table exactly once; without
one the query must fail, loudly, before the broker drops any.

Runs on every RabbitMQ 4.x in AMQP_TEST_BROKERS; the embedded broker's side of it is
covered without Spark (tests/queues/test_delivery_limit.py).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pika
import pytest

from .. import brokers
from ..broker.helpers import connect, consume_n, ready_count, wait_for
from .crash_jobs import TIMEOUT, Budget, Job, kill_between_delta_commit_and_commit_log, message_ids, offsets_logged

# The query is started several times, and the test's waits share one Budget (crash_jobs.py says why these numbers).
pytestmark = [pytest.mark.spark, pytest.mark.delta, pytest.mark.timeout(TIMEOUT)]

AGED_MESSAGES = 400
MESSAGES = 1600  # the aged ones, then fresh ones published while the query is killed
AGED = 19  # x-delivery-count: the default delivery-limit (20) drops a message at its 21st return


FOUR = [b for b in brokers.by_version() if b.version >= (4, 0)]


@pytest.fixture(scope="module", params=[f"rabbitmq-{b.name}" for b in FOUR] or ["rabbitmq-4.x"])
def url(request: pytest.FixtureRequest) -> str:
    found = [b.url for b in FOUR if f"rabbitmq-{b.name}" == request.param]
    if not found:
        pytest.skip("no RabbitMQ 4.x in AMQP_TEST_BROKERS")
    return found[0]


def _aged_quorum_queue(url: str, queue: str, budget: Budget) -> None:
    conn = connect(url)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(AGED_MESSAGES):
        ch.basic_publish("", queue, f"payload {i}".encode(), pika.BasicProperties(message_id=f"m-{i:05d}"))
    conn.close()
    for _ in range(AGED):
        conn = connect(url)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=AGED_MESSAGES)
        assert len(consume_n(conn, ch, queue, AGED_MESSAGES, timeout=budget.left(30))) == AGED_MESSAGES
        conn.close()  # unacked: a return that counts


def _publish_fresh(url: str, queue: str) -> threading.Thread:
    """Fresh messages after the aged ones, 50 at a time: batches go on through the kills."""

    def run() -> None:
        conn = connect(url)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(AGED_MESSAGES, MESSAGES):
            ch.basic_publish("", queue, f"payload {i}".encode(), pika.BasicProperties(message_id=f"m-{i:05d}"))
            if i % 50 == 49:
                time.sleep(0.5)
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_a_query_that_keeps_dying_never_lets_the_delivery_limit_drop_a_message(spark, url: str, tmp_path: Path, journal: bool) -> None:  # type: ignore[no-untyped-def]
    if journal and url != FOUR[-1].url:
        # Three JVM starts, about 100 s of CI: the newest 4.x runs it (tests/queues/test_delivery_limit.py has each 4.x).
        pytest.skip("the journal's run under SIGKILLs is on the newest RabbitMQ 4.x")
    queue = f"test.limit.{random.getrandbits(32):08x}"
    budget = Budget()
    _aged_quorum_queue(url, queue, budget)
    try:
        if not journal:
            job = Job(url, queue, tmp_path, False)
            assert job.wait(budget.left(300)) != 0
            output = job.output()
            assert f"queue '{queue}'" in output and f"x-delivery-count {AGED}" in output and "journalLocation" in output, output[-3000:]
            assert ready_count(url, queue) == AGED_MESSAGES  # failed before the broker dropped any
            return
        publisher = _publish_fresh(url, queue)
        rng = random.Random(11)
        kill_between_delta_commit_and_commit_log(url, queue, tmp_path, True, budget)
        # With the kill above, two returns: a query that held the aged messages unacknowledged would lose them.
        job = Job(url, queue, tmp_path, True)
        planned = offsets_logged(tmp_path)
        job.wait_started(budget.left(180))
        wait_for(lambda: offsets_logged(tmp_path) > planned or job.proc.poll() is not None, timeout=budget.left(180))
        time.sleep(rng.uniform(0.0, 2.0))  # a random moment while batches run
        job.kill()
        publisher.join(budget.left(120))
        assert not publisher.is_alive()
        final = Job(url, queue, tmp_path, True, "--available-now")
        assert final.wait(budget.left(300)) == 0, final.output()[-3000:]
        ids = message_ids(spark, tmp_path / "table")
        assert set(ids) == {f"m-{i:05d}" for i in range(MESSAGES)} and max(ids.values()) == 1
        assert ready_count(url, queue) == 0
    finally:
        conn = connect(url)
        conn.channel().queue_delete(queue)
        conn.close()
