"""The queue source over AMQP 1.0 on ActiveMQ Artemis (``AMQP_TEST_ARTEMIS_URL``), into Delta through SIGKILLs: exactly
once with the journal, as on RabbitMQ (``test_exactly_once.py``). Artemis marks a redelivery only sometimes (a
delivery-count of 1 after some lost connections), so the journal and the copies the source recognises are all there is
between a replayed batch and a duplicate.

Artemis has no Trigger.AvailableNow for this source (no queue depth over AMQP 1.0), so the last run is an ordinary
query, stopped once Delta holds every message and the broker has every one settled."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.options import parse_sink_options

from ..broker.helpers import wait_for
from ..locks import exclusive
from .crash_jobs import TIMEOUT, Budget, Job, kill_between_delta_commit_and_commit_log, message_ids, offsets_logged

URL = os.environ.get("AMQP_TEST_ARTEMIS_URL")
TOOL = Path(__file__).resolve().parents[2] / "tools" / "artemis"
pytestmark = [
    pytest.mark.spark,
    pytest.mark.delta,
    pytest.mark.timeout(TIMEOUT),
    pytest.mark.skipif(not URL, reason="AMQP_TEST_ARTEMIS_URL not set (tools/artemis start; tools/artemis url)"),
]

MESSAGES, BATCH = 2000, 50


@pytest.fixture(autouse=True)
def one_at_a_time() -> Iterator[None]:
    with exclusive("artemis"):  # tests/artemis restarts the broker
        yield


def _publish(queue: str) -> threading.Thread:
    """m-00000 … through the sink over AMQP 1.0 (Artemis makes the anycast queue for it), 50 at a time with pauses: a
    publisher still running through the kills."""
    assert URL is not None
    opts = parse_sink_options({"uri": URL, "protocol": "amqp1.0", "routingKey": queue})

    def batches() -> Iterator[pa.RecordBatch]:
        for first in range(0, MESSAGES, BATCH):
            ids = range(first, first + BATCH)
            yield pa.RecordBatch.from_pydict({"body": [b"payload %d" % i for i in ids], "message_id": [f"m-{i:05d}" for i in ids]})
            time.sleep(0.5)

    thread = threading.Thread(
        target=lambda: asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts)).publish(batches(), "test")), daemon=True
    )
    thread.start()
    return thread


def _held(queue: str) -> int:
    """Messages the broker holds for ``queue``, those delivered and not settled included (the CLI's MESSAGE COUNT)."""
    assert URL is not None
    parts = urllib.parse.urlsplit(URL)
    core = subprocess.run([str(TOOL), "core-url"], capture_output=True, text=True, check=True).stdout.strip()
    command = [str(TOOL), "cli", "queue", "stat", "--queueName", queue, "--url", core]
    command += ["--user", parts.username or "guest", "--password", parts.password or "guest"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == queue:
            return int(cells[3])
    raise AssertionError(f"no queue {queue!r} in:\n{out}")


def test_sigkills_on_artemis_exactly_once_with_the_journal(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert URL is not None
    queue = f"test.artemis.{uuid.uuid4().hex[:8]}"  # crash_jobs.Job reads it over AMQP 1.0, exclusiveConsumer=false
    budget = Budget()
    publisher = _publish(queue)

    kill_between_delta_commit_and_commit_log(URL, queue, tmp_path, True, budget)
    job = Job(URL, queue, tmp_path, True)
    planned = offsets_logged(tmp_path)
    wait_for(lambda: offsets_logged(tmp_path) > planned, timeout=budget.left(180))
    time.sleep(random.Random(13).uniform(0.0, 2.0))  # a random moment while batches run
    job.kill()
    publisher.join(budget.left(120))
    assert not publisher.is_alive()

    final = Job(URL, queue, tmp_path, True)
    try:
        # Each check is a Spark job reading Delta, and each _held a JVM (Artemis' CLI): every 2 s, not every 0.05 s, on a
        # CI machine whose two cores the lanes share.
        wait_for(lambda: len(message_ids(spark, tmp_path / "table")) == MESSAGES, timeout=budget.left(240), interval=2)
        wait_for(lambda: _held(queue) == 0, timeout=budget.left(120), interval=2)  # every message settled, once its batch committed
    finally:
        final.kill()
    ids = message_ids(spark, tmp_path / "table")
    assert set(ids) == {f"m-{i:05d}" for i in range(MESSAGES)} and max(ids.values()) == 1
