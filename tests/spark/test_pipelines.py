"""docs/pipelines.md's pipeline, run with ``spark-pipelines`` (Spark Declarative Pipelines' CLI) on the embedded broker.

The page's spec and file, with its placeholders swapped for the broker, a temporary folder and the password in
``RABBITMQ_PASSWORD``, plus a file that calls ``spark_amqp.register(spark)`` as the README once advised for Spark
Connect (on PySpark 4.3.0 a registration turned every completed run into exit code 1: SPARK-59135). The CLI runs
against a Spark Connect server of the test's own (``connect_server.py``: loopback, a free port; the CLI's own
server would take port 15002) with Hive's catalog, as the page says to set it. Four runs: the first; one SIGKILLed
mid-batch (server and CLI); one after it, with more messages; a full refresh of both tables. Each run must exit 0,
and every id must be in each table exactly once, read through Spark (the file sink's log, not every file a killed
batch left); after the full refresh the queue-fed table holds only what came after it, as the page says.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from ..brokers import counts
from ..loopback import not_on_loopback
from ..markdown import ROOT, code_blocks
from .connect_server import ConnectServer
from .crash_jobs import Budget

TIMEOUT = 900
WAITS = 780  # the server starts, the runs and the wait for a batch to kill share them

pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.timeout(TIMEOUT)]

PAGE = ROOT / "docs" / "pipelines.md"
PLACEHOLDER_URI = "amqps://etl@rabbit.internal:5671/prod"
PLACEHOLDER_ROOT = "/srv/pipelines/amqp_ingest/"
CLI = Path(sys.executable).with_name("spark-pipelines")
PASSWORD = "guest"
BATCH = 2000  # the page's maxMessagesPerTrigger
REGISTER = """import spark_amqp

spark_amqp.register(spark)  # as the README advised for Spark Connect: it must not fail the run
"""


def _pipeline(work: Path, broker: EmbeddedBroker) -> Path:
    """The page's spec and file, localised, in ``work/amqp_ingest``; returns the spec's path."""
    blocks = [b for b in code_blocks(PAGE) if b.marker and "test_pipelines.py" in b.marker]
    spec, tables = (next(b.code for b in blocks if b.lang == lang) for lang in ("yaml", "python"))
    assert len(blocks) == 2, [b.name for b in blocks]
    folder = work / "amqp_ingest"
    (folder / "transformations").mkdir(parents=True)
    for path, text in ((folder / "spark-pipeline.yml", spec), (folder / "transformations" / "amqp_tables.py", tables)):
        text = text.replace(PLACEHOLDER_URI, f"amqp://guest@{broker.host}:{broker.port}/%2F").replace(PLACEHOLDER_ROOT, f"{work}/")
        assert "rabbit.internal" not in text and "/srv/" not in text, f"{path.name}: a placeholder the test does not know"
        path.write_text(text)
    assert f'"maxMessagesPerTrigger", "{BATCH}"' in tables
    (folder / "transformations" / "register.py").write_text(REGISTER)
    return folder / "spark-pipeline.yml"


def _publish(url: str, first: int, count: int) -> None:
    """Ids first..first+count-1 into the queue and the stream, each confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(first, first + count):
        props = pika.BasicProperties(message_id=f"id-{i}", content_type="application/json")
        for target in ("orders", "events"):
            ch.basic_publish("", target, b'{"id": %d}' % i, props)
    conn.close()


class Run:
    """One ``spark-pipelines run`` against the server, in a process group of its own; its output in a file."""

    def __init__(self, spec: Path, server: ConnectServer, env: dict[str, str], *flags: str) -> None:
        self.log = spec.parent.parent / f"run-{len(list(spec.parent.parent.glob('run-*.log')))}.log"
        args = [str(CLI), "run", "--spec", str(spec), "--remote", server.url, *flags]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def finish(self, timeout: float) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{self.output()[-4000:]}") from None
        assert "Run is COMPLETED." in self.output() and code == 0, f"exit code {code}:\n{self.output()[-4000:]}"

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def _checkpoint(work: Path, table: str) -> Path:
    """The flow's newest checkpoint (a full refresh starts the next number)."""
    found = sorted(work.glob(f"storage/_checkpoints/*/*/{table}/{table}/[0-9]*"), key=lambda p: int(p.name))
    assert found, f"no checkpoint for {table}"
    return found[-1]


def _logged(checkpoint: Path, kind: str) -> set[int]:
    return {int(p.name) for p in (checkpoint / kind).glob("[0-9]*")}


def _ids(spark, work: Path, table: str) -> collections.Counter[str]:  # type: ignore[no-untyped-def]
    """The table's message ids, read as Spark reads it: the files its sink's log names, not those a killed batch left."""
    rows = spark.read.parquet(str(work / "warehouse" / table)).select("message_id").collect()
    return collections.Counter(r.message_id for r in rows)


def _assert_once(spark, work: Path, table: str, ids: range) -> None:  # type: ignore[no-untyped-def]
    found = _ids(spark, work, table)
    twice = sorted(i for i, n in found.items() if n > 1)
    missing = sorted({f"id-{i}" for i in ids} - found.keys())
    extra = sorted(found.keys() - {f"id-{i}" for i in ids})
    assert (len(found), twice[:5], missing[:5], extra[:5]) == (len(ids), [], [], []), table


def test_the_pipeline_page(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    budget = Budget(WAITS)
    with EmbeddedBroker(consumer_timeout_ms=None) as broker:
        spec = _pipeline(tmp_path, broker)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "RABBITMQ_PASSWORD": PASSWORD}
        conf = {
            "spark.sql.catalogImplementation": "hive",
            "spark.sql.warehouse.dir": str(tmp_path / "warehouse"),
            "spark.sql.shuffle.partitions": "2",
        }

        def start_server() -> ConnectServer:
            starts = len(list(tmp_path.glob("server-*.log")))
            server = ConnectServer(tmp_path / f"server-{starts}.log", conf, env, cwd=tmp_path)  # Derby's metastore_db here
            server.wait_started(budget.left(180))
            return server

        server = start_server()
        try:
            # Run 1: what the queue and the stream hold.
            _publish(broker.url, 0, 3000)
            Run(spec, server, env).finish(budget.left(300))
            for table in ("orders_raw", "events_raw"):
                _assert_once(spark, tmp_path, table, range(3000))
            assert counts(broker.url, "orders", broker) == (0, 0)

            # Run 2, killed with its server once its second batch of the queue has started.
            _publish(broker.url, 3000, 4 * BATCH)
            orders = _checkpoint(tmp_path, "orders_raw")
            second = max(_logged(orders, "commits")) + 2
            run = Run(spec, server, env)
            deadline = time.monotonic() + budget.left(300)
            while not (second in _logged(orders, "offsets") and second not in _logged(orders, "commits")):
                assert run.proc.poll() is None, f"the run ended before its second batch of the queue:\n{run.output()[-4000:]}"
                assert time.monotonic() < deadline, f"no second batch of the queue:\n{run.output()[-4000:]}"
                time.sleep(0.05)
            assert not_on_loopback(server.proc.pid) + not_on_loopback(run.proc.pid) == []
            server.kill()
            run.kill()
            assert _logged(orders, "offsets") - _logged(orders, "commits"), "the kill did not land mid-batch"

            # Run 3: on a new server, with more messages: the killed batch once, then the rest.
            server = start_server()
            _publish(broker.url, 3000 + 4 * BATCH, 1000)
            Run(spec, server, env).finish(budget.left(300))
            total = 3000 + 4 * BATCH + 1000
            for table in ("orders_raw", "events_raw"):
                _assert_once(spark, tmp_path, table, range(total))
            assert counts(broker.url, "orders", broker) == (0, 0)

            # Run 4: a full refresh of both. The stream is read again from its first offset; the queue's messages
            # were acknowledged: only those published since are in the refreshed table.
            _publish(broker.url, total, 500)
            Run(spec, server, env, "--full-refresh", "events_raw,orders_raw").finish(budget.left(300))
            _assert_once(spark, tmp_path, "events_raw", range(total + 500))
            _assert_once(spark, tmp_path, "orders_raw", range(total, total + 500))
            assert counts(broker.url, "orders", broker) == (0, 0)
        finally:
            server.stop()
