"""Where users run the connector: Spark Connect (auto-registration and the explicit
``spark_amqp.register``) and a multi-process Spark whose executors are other JVMs.

Each case is a subprocess (``deploy_job.py``): one process holds one SparkContext, and a
Spark Connect client refuses to start beside the shared classic session. The Spark Connect
case's server is a JVM of its own (``connect_server.py``: loopback, a port the system gives
it), as a user's server would be. On the newest real RabbitMQ when one is set (CI), otherwise
on the embedded broker: what is tested here is Spark's deployment, and each case starts
Spark anew (about 40 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.parquet as pq
import pytest
from spark_amqp_broker import EmbeddedBroker

from ..broker.helpers import connect, drain
from ..brokers import counts, publish
from ..conftest import REAL_URL, NameFactory
from .connect_server import ConnectServer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(480)]  # its job has 420 s; on a loaded machine one took over 300

JOB = Path(__file__).with_name("deploy_job.py")
HIDDEN = Path(__file__).with_name("hidden")
MESSAGES = 500


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[str, EmbeddedBroker | None]]:
    if REAL_URL:
        yield REAL_URL, None
    else:
        with EmbeddedBroker(consumer_timeout_ms=None) as embedded:
            yield embedded.url, embedded


def _run(mode: str, url: str, work: Path, queues: tuple[str, str], register: bool = False) -> dict[str, object]:
    parts = urlsplit(url)
    # The password travels as the 'password' option, as the README tells users to pass it.
    host = f"{parts.username}@{parts.hostname}:{parts.port}"
    args = [sys.executable, str(JOB), "--mode", mode, "--uri", urlunsplit(parts._replace(netloc=host))]
    args += ["--password", parts.password or "", "--in-queue", queues[0], "--out-queue", queues[1]]
    args += ["--messages", str(MESSAGES), "--work", str(work)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if register:
        args.append("--register")
        # Where Spark's lookup runs: in the Python workers of the server's JVM.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HIDDEN), env.get("PYTHONPATH")) if p)
    deadline = time.monotonic() + 420  # the job's and its server's start share it, within the test's timeout
    server = None
    if mode == "connect":
        conf = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}
        server = ConnectServer(work / "server.log", conf, env, cwd=work)
    try:
        if server is not None:
            server.wait_started(180)
            args += ["--remote", server.url]
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=deadline - time.monotonic())
    finally:
        if server is not None:
            server.stop()
    output = (done.stdout + done.stderr)[-4000:] + (f"\n--- the server's log:\n{server.output()[-3000:]}" if server else "")
    assert done.returncode == 0 and "DONE" in done.stdout, output
    assert ("NOT FOUND before register" in done.stdout) == register, output
    return dict(json.loads((work / "info.json").read_text()))


def _check_round_trip(url: str, embedded: EmbeddedBroker | None, work: Path, queues: tuple[str, str]) -> list[dict[str, object]]:
    rows = pq.read_table(work / "out").to_pylist()  # the file sink's _spark_metadata is skipped
    assert sorted(r["message_id"] for r in rows) == sorted(f"r{i}" for i in range(MESSAGES))
    assert all(r["queue"] == queues[0] and r["body"] == f"body {r['message_id']}".encode() for r in rows)
    assert counts(url, queues[0], embedded) == (0, 0)  # the AvailableNow run acked its last batch
    written = drain(connect(url).channel(), queues[1], limit=2 * MESSAGES)
    assert sorted(p.message_id for _, p, _ in written) == sorted(f"w{i}" for i in range(MESSAGES))
    return rows


def _queues(url: str, names: NameFactory) -> tuple[str, str]:
    src, dst = names.queue("in"), names.queue("out")
    publish(url, src, [f"body r{i}".encode() for i in range(MESSAGES)], message_id=lambda i: f"r{i}")
    publish(url, dst, [])
    return src, dst


@pytest.fixture
def queues(broker) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    names = NameFactory()
    yield _queues(broker[0], names)
    conn = connect(broker[0])
    for q in names.queues:
        conn.channel().queue_delete(q)
    conn.close()


# What differs between PySpark lines is how a data source is found: auto-registration runs on every
# line (make test-matrix); the explicit register() and the executors in other JVMs on the pinned one.
@pytest.mark.parametrize("register", [False, pytest.param(True, marks=pytest.mark.pinned)], ids=["auto-registration", "register-call"])
def test_spark_connect_reads_and_writes(broker, queues, tmp_path: Path, register: bool) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    _run("connect", url, tmp_path, queues, register=register)
    _check_round_trip(url, embedded, tmp_path, queues)


@pytest.mark.pinned
def test_executors_in_other_jvms(broker, queues, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, embedded = broker
    info = _run("local-cluster", url, tmp_path, queues)
    assert info["executors"] == 2
    rows = _check_round_trip(url, embedded, tmp_path, queues)
    # The batch's Arrow data travelled inside its partitions to an executor JVM, not the driver's.
    jvms = {r["jvm"] for r in rows}
    assert -1 not in jvms and info["driver_jvm"] not in jvms
