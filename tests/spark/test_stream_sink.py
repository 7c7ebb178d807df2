"""The stream-protocol sink under Spark: a streaming write SIGKILLed between the publish and Spark's commit,
several times, then run to the end from its checkpoint, holds every row once with deduplication (and the
killed batches twice without it, which shows the test can fail).

Each run is ``sink_kill_job.py`` in a process group of its own: its writer's ``commit`` (on the driver, after
every message of the batch was confirmed, before Spark writes the batch to the checkpoint's commit log)
SIGKILLs the group, the JVM and every Python worker included, the first time it sees a batch. The next run
replays that batch with the same rows, the same query id and the same batch id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from tests.sink.stream_helpers import create, delete, records, run
from tests.stream_protocol.conftest import STREAM_BROKERS

# pinned: the kills cost a JVM start each, and nothing here differs between PySpark lines (CI time). faults: a
# process killed is one of production's faults, and make test's faults lane ends earlier than its other Spark tests.
pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("sink_kill_job.py")
FILES, LINES = 3, 40  # one file a batch (maxFilesPerTrigger=1): 3 batches of 40 rows
KILLS = 2  # batches 0 and 1 are killed once each, between their publish and Spark's commit


@pytest.fixture(scope="module")
def stream_url() -> Iterator[str]:
    """The newest real RabbitMQ's stream port, else the embedded broker's."""
    if STREAM_BROKERS:
        yield STREAM_BROKERS[max(STREAM_BROKERS, key=lambda name: tuple(int(p) for p in name.split(".")))]
        return
    from spark_amqp_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.stream_url


def _run_job(work: Path, stream_url: str, stream: str, deduplication: str, kill: bool) -> int:
    args = [sys.executable, str(JOB), "--uri", stream_url, "--stream", stream, "--source", str(work / "in")]
    args += ["--checkpoint", str(work / "checkpoint"), "--markers", str(work / "markers"), "--deduplication", deduplication]
    log = work / f"run-{len(list(work.glob('run-*.log')))}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, *(["--kill-in-commit"] if kill else [])], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the job did not finish:\n{log.read_text(errors='replace')[-3000:]}") from None
    if code not in (0, -signal.SIGKILL):
        raise AssertionError(f"the job failed ({code}):\n{log.read_text(errors='replace')[-3000:]}")
    return code


@pytest.mark.parametrize("deduplication", ["true", "false"])
def test_a_write_killed_between_publish_and_commit_holds_every_row_once(stream_url: str, tmp_path: Path, deduplication: str) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (tmp_path / "markers").mkdir()
    for f in range(FILES):
        path = source / f"f{f}.txt"
        path.write_text("".join(f"f{f}-line{i:02d}\n" for i in range(LINES)))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the file source takes files oldest first: f0 is batch 0
    stream = f"sink-killed-{deduplication}-{uuid.uuid4().hex[:8]}"  # one of its own: a killed run leaves its stream
    create(stream_url, stream)
    # Without deduplication one kill shows the replay (each kill is a JVM start: CI time).
    kills = KILLS if deduplication == "true" else 1
    try:
        for _ in range(kills):  # each run replays the batch the one before was killed in, then is killed in the next
            assert _run_job(tmp_path, stream_url, stream, deduplication, kill=True) == -signal.SIGKILL
        assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == [str(b) for b in range(kills)]
        assert _run_job(tmp_path, stream_url, stream, deduplication, kill=False) == 0
        query_id = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]

        async def sequences(c: Any) -> list[int]:
            return [await c.publisher_sequence(f"{query_id}-{p}", stream) for p in range(2)]

        # Spark kept the query id in the checkpoint, and each task learnt it, its partition and the batch id: the
        # last batch (2) of 40 rows was split 20 and 20, so each partition's producer last stored (2 << 32) + 19.
        last = (FILES - 1 << 32) + LINES // 2 - 1
        assert run(stream_url, sequences) == ([last, last] if deduplication == "true" else [0, 0])
    finally:
        got = records(stream_url, stream)
        delete(stream_url, stream)

    expected = sorted(f"f{f}-line{i:02d}".encode() for f in range(FILES) for i in range(LINES))
    bodies = [RowMaker(stream, Conversion.of(None)).row(r, 0)[0] for r in got]
    if deduplication == "true":
        assert sorted(bodies) == expected
    else:  # each killed batch was published twice
        replayed = sorted(f"f{f}-line{i:02d}".encode() for f in range(kills) for i in range(LINES))
        assert sorted(bodies) == sorted(expected + replayed)
