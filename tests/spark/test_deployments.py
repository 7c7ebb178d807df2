"""Where users run the connector: Spark Connect (auto-registration and the explicit
``spark_amqp.register``) and a multi-process Spark whose executors are other JVMs.

Each case is a subprocess (``deploy_job.py``): one process holds one SparkContext, and a
local Spark Connect server refuses to start beside the shared classic session. On the
newest real RabbitMQ when one is set (CI), otherwise on the embedded broker: what is
tested here is Spark's deployment, and each case starts Spark anew (about 40 s).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.parquet as pq
import pytest
from spark_amqp_broker import EmbeddedBroker

from ..broker.helpers import connect, drain
from ..brokers import counts, publish
from ..conftest import REAL_URL, NameFactory

pytestmark = [pytest.mark.spark, pytest.mark.timeout(480)]  # its job has 420 s; on a loaded machine one took over 300

JOB = Path(__file__).with_name("deploy_job.py")
HIDDEN = Path(__file__).with_name("hidden")
MESSAGES = 500
# A local Spark Connect server listens on port 15002 (PySpark picks a free one only with SPARK_TESTING,
# which changes more than that): runs on one machine (CI runs several lanes at once) take turns. The lock
# is in the checkout, which every lane sees, the Python 3.13 lane's chroot included (its /tmp is its own).
CONNECT_LOCK = Path(__file__).resolve().parents[2] / ".cache" / "spark-amqp-connect-15002.lock"


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
    env = dict(os.environ)
    if register:
        args.append("--register")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HIDDEN), env.get("PYTHONPATH")) if p)
    CONNECT_LOCK.parent.mkdir(exist_ok=True)
    with CONNECT_LOCK.open("w") as lock:
        if mode == "connect":
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=420)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "DONE" in done.stdout, output[-4000:]
    assert ("NOT FOUND before register" in done.stdout) == register, output[-4000:]
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
