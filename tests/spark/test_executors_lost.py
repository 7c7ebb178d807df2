"""Executors lost in the middle of a batch, for every mode: ``executor_kill_job.py`` runs seven queries on
``local-cluster`` (executors in JVMs of their own) against RabbitMQ 4.3, and in each query one task stops at a marked
row until this test SIGKILLs its executor: a stream range part read, a queue batch part written, a sink partition
part published with its messages not yet confirmed as far as Spark knows. Spark's worker starts a new executor and
Spark runs the lost tasks again. Every id must arrive exactly once (at least once for the AMQP sinks).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import pika
import pyarrow.parquet as pq
import pytest

from ..brokers import STREAM_URLS, by_version

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.faults, pytest.mark.timeout(900)]

JOB = Path(__file__).with_name("executor_kill_job.py")
N = 400
QUERIES = ("queue", "stream-protocol", "stream-amqp", "stream-amqp10", "sink-amqp", "sink-stream", "sink-amqp10")


def _broker() -> tuple[str, str]:
    for broker in reversed(by_version()):
        if broker.version >= (4, 0) and broker.url in STREAM_URLS:
            return broker.url, STREAM_URLS[broker.url]
    pytest.skip("needs a RabbitMQ 4.x with its stream port (AMQP_TEST_BROKERS, AMQP_TEST_STREAM_BROKERS)")


def _declare(url: str, queues: dict[str, str], preload: dict[str, str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for name, kind in queues.items():
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind})
    ch.confirm_delivery()
    for name, prefix in preload.items():
        for i in range(N):
            ch.basic_publish("", name, f"{prefix}{i}".encode(), pika.BasicProperties(message_id=f"{prefix}{i}", delivery_mode=2))
    conn.close()


def _ids(path: Path) -> list[str]:
    """The ids in the files the file sink committed (its ``_spark_metadata`` log): a killed task leaves files of its
    own, which no batch lists."""
    committed: set[str] = set()
    for log in (path / "_spark_metadata").iterdir():
        if not re.fullmatch(r"\d+(\.compact)?", log.name):  # its checksum files
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry["action"] == "add":
                committed.add(urllib.parse.urlsplit(entry["path"]).path)
            else:
                committed.discard(urllib.parse.urlsplit(entry["path"]).path)
    return [r["message_id"] for f in sorted(committed) for r in pq.read_table(f).to_pylist()]


def test_executors_killed_mid_batch_in_every_mode(tmp_path: Path) -> None:
    url, stream_url = _broker()
    tag = uuid.uuid4().hex[:8]
    q, s, out_q, out_s, out_q10 = (f"exec.{k}.{tag}" for k in ("q", "s", "outq", "outs", "outq10"))
    _declare(url, {q: "quorum", s: "stream", out_q: "quorum", out_s: "stream", out_q10: "quorum"}, {q: "q", s: "s"})
    args = [sys.executable, str(JOB), "--uri", url, "--stream-uri", stream_url, "--queue", q, "--stream", s]
    args += ["--out-queue", out_q, "--out-stream", out_s, "--out-queue10", out_q10, "--work", str(tmp_path), "--messages", str(N)]
    kills = tmp_path / "kill"
    killed: dict[str, float] = {}
    began = time.monotonic()
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        while job.poll() is None and time.monotonic() - began < 780:
            for marker in kills.glob("*.pid") if kills.exists() else []:
                name = marker.stem
                if name in killed:
                    continue
                pid = int(marker.read_text())
                assert pid > 1, f"{name}: its task found no executor JVM above it ({pid})"  # os.kill(-1) kills all
                try:  # a task held on an executor already killed for another query died with it
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed[name] = time.monotonic() - began
                (kills / f"{name}.killed").touch()
            time.sleep(0.2)
        output = job.stdout.read() if job.stdout else ""
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 0 and "DONE" in output, _why(output)
    print("\nexecutors killed (s after the job started):", {k: round(v, 1) for k, v in killed.items()})
    assert sorted(killed) == sorted(QUERIES), killed  # each query lost a task mid-batch
    said = "\n".join(line for line in output.splitlines() if "AMQP source" in line or "AMQP sink" in line)
    print("the connector's warnings:\n" + said)  # what the sources saw of the kills (shown with -rP, and on failure)
    for name, prefix in (("queue", "q"), ("stream-protocol", "s"), ("stream-amqp", "s"), ("stream-amqp10", "s")):
        counted = collections.Counter(_ids(tmp_path / name))
        assert sorted(counted) == sorted(f"{prefix}{i}" for i in range(N)), (name, len(counted))
        assert max(counted.values()) == 1, (name, [k for k, c in counted.items() if c > 1][:10])
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for name, queue in (("sink-amqp", out_q), ("sink-amqp10", out_q10)):
        got = set()
        while (message := ch.basic_get(queue, auto_ack=True))[0] is not None:
            got.add(message[1].message_id)
        assert got == {f"k{i}" for i in range(N)}, (name, len(got))  # at least once
    conn.close()
    written = _stream_ids(url, out_s)
    assert sorted(written) == sorted(f"k{i}" for i in range(N)) and len(set(written)) == N, len(written)  # deduplicated
    conn = pika.BlockingConnection(pika.URLParameters(url))
    for name in (q, s, out_q, out_s, out_q10):
        conn.channel().queue_delete(name)
    conn.close()


def _why(output: str) -> str:
    """The job's own report of what failed, rather than the noise of the queries stopped by its exit after it."""
    marks = [at for at in (output.find(m) for m in ("FAILED", "TIMEOUT", "Traceback")) if at >= 0]
    at = min(marks) if marks else max(0, len(output) - 6000)
    return output[at : at + 6000]


def _stream_ids(url: str, stream: str) -> list[str]:
    """Every message id in ``stream``, read over AMQP 0-9-1 from its first offset."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    ids: list[str] = []
    for method, props, _ in ch.consume(stream, arguments={"x-stream-offset": "first"}, inactivity_timeout=3):
        if method is None:
            break
        ids.append(props.message_id)
        ch.basic_ack(method.delivery_tag)
    conn.close()
    return ids
