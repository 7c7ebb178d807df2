"""What the crash tests share: AMQP -> Delta queries run as subprocesses (``crash_job.py``), each in its own
process group, that a test SIGKILLs and starts again from the same checkpoint (and journal); what they left
in Delta and in Spark's checkpoint; and the time the waits of one test share.

A crash test takes 1.5 to 2 minutes (docs/development.md): ``TIMEOUT`` gives it five times that or more, so
that one that hangs costs CI ten minutes, not thirty. Its waits take their time from one ``Budget`` of ``WAITS``
seconds, so that together they end before ``TIMEOUT`` and fail with the job's output instead of a bare
timeout; the rest of ``TIMEOUT`` is for what they do not bound: the SparkSession's start (the first Spark test
of a run pays it), reading the table, the kills and the broker's final counts.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TIMEOUT = 600
WAITS = 450

JOB = Path(__file__).with_name("crash_job.py")
ROOT = JOB.parent.parent.parent


class Budget:
    """What is left of a test's ``WAITS``: each wait of the test takes at most what it needs and what is left."""

    def __init__(self, seconds: float = WAITS) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self, at_most: float) -> float:
        """The timeout for the next wait: ``at_most``, or less if the test's waits have used more of theirs."""
        left = self.deadline - time.monotonic()
        assert left > 0, f"the waits of this test used up their {self.seconds:g}s"
        return min(at_most, left)


class Job:
    """One run of the query: a process group we can SIGKILL whole."""

    def __init__(self, url: str, queue: str, work: Path, journal: bool, *flags: str) -> None:
        if queue.startswith("test.stream."):
            flags = ("--stream", *flags)
        elif queue.startswith("test.amqp10."):
            flags = ("--protocol", "amqp1.0", *flags)
        elif queue.startswith("test.artemis."):  # no management node there to ask for an exclusive consumer
            flags = ("--protocol", "amqp1.0", "--shared-queue", *flags)
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

    def wait_started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "STARTED" not in self.output():
            assert self.proc.poll() is None, f"the job exited early:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"the job did not start:\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)  # a SIGKILLed process ends at once

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not finish within {timeout:.0f}s:\n{self.output()[-3000:]}") from None


def last_delta_batch(table: Path) -> int | None:
    """The streaming batch id Delta's newest commit recorded (its txn action)."""
    logs = sorted((table / "_delta_log").glob("*.json"))
    if not logs:
        return None
    for line in logs[-1].read_text().splitlines():
        action = json.loads(line)
        if "txn" in action:
            return int(action["txn"]["version"])
    return None


def kill_between_delta_commit_and_commit_log(url: str, queue: str, work: Path, journal: bool, budget: Budget) -> None:
    for _attempt in range(3):
        job = Job(url, queue, work, journal, "--kill-after-delta-commit")
        code = job.wait(budget.left(200))
        assert code == -signal.SIGKILL, job.output()[-3000:]
        batch = last_delta_batch(work / "table")
        if batch is not None and not (work / "checkpoint" / "commits" / str(batch)).exists():
            return  # Delta has batch N, Spark's commit log does not: the window was hit
    raise AssertionError("never killed inside the window between the Delta commit and the commit log")


def offsets_logged(work: Path) -> int:
    return len(list((work / "checkpoint" / "offsets").glob("[0-9]*")))


def message_ids(spark, table: Path) -> collections.Counter[str]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("delta").load(str(table)).select("message_id").collect()
    return collections.Counter(r.message_id for r in rows)
