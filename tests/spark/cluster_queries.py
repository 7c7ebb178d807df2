"""What the Spark tests on the 3-node cluster share: queues declared on a chosen node, preloaded with unique ids, the
ids a query wrote, and the pauses between its batches around a fault."""

from __future__ import annotations

import collections
import datetime
import glob
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest

from ..cluster.conftest import Cluster, cluster_lock, find_cluster, silent_network_possible

N = 2000
# Batches of BATCH rows every TRIGGER: N rows flow for about 80 s, across a test's faults. A fault test's CPU goes
# mostly per batch (the driver's micro-batch, a Python worker's task), and CI's lanes share two cores: 100 rows every
# 4 s took a third more CPU (the load-balancer test alone: 176 s of CPU against 136 s, measured here).
TRIGGER, BATCH = "8 seconds", 200
SPARK_WORKER_START = "failed to connect back"  # Spark's error when a Python worker it started missed its 10 s
SINK_OPTIONS = ("connectionTimeout", "brokerOutageTimeout", "heartbeat")  # of the options common to a test's queries


def whole_cluster() -> Cluster:
    """The 3-node cluster with its stream port, as the fault tests need it (they skip without one)."""
    found = find_cluster()
    if found.stream_url is None or len(found.nodes) < 3:
        pytest.skip("needs AMQP_TEST_CLUSTER_STREAM_URL and the three nodes tools/rabbitmq runs")
    return found


@contextmanager
def cluster_to_ourselves(drops_packets: bool = False) -> Iterator[Cluster]:
    """The whole cluster, no other cluster test running meanwhile (a skip where packets cannot be dropped, for a test
    that drops them)."""
    found = whole_cluster()
    why = silent_network_possible() if drops_packets else None
    if why:
        pytest.skip(why)
    with cluster_lock():
        yield found


def channel(cluster: Cluster, node: str) -> Any:
    return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{cluster.node(node).port}/%2F")).channel()


def declare(cluster: Cluster, on: str, name: str, kind: str, **arguments: object) -> None:
    ch = channel(cluster, on)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind, "x-queue-leader-locator": "client-local", **arguments})
    ch.connection.close()


def preload(cluster: Cluster, queue: str, prefix: str, ids: range = range(N), via: str = "c1") -> None:
    ch = channel(cluster, via)
    ch.confirm_delivery()
    for i in ids:
        ch.basic_publish("", queue, f"{prefix}{i}".encode(), pika.BasicProperties(message_id=f"{prefix}{i}", delivery_mode=2))
    ch.connection.close()


def ids(spark, path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    if not glob.glob(f"{path}/*.parquet"):
        return []
    return [r["message_id"] for r in spark.read.parquet(str(path)).select("message_id").collect()]


def pause(progress: list[Any], window: tuple[float, float]) -> float:
    """The longest time without a batch with rows around ``window`` in a query's ``progress``: from the last batch
    that began before a gap to the first after it, over the gaps that overlap the window."""
    began, ended = window
    starts = sorted(datetime.datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp() for p in progress if p.numInputRows)
    gaps = [b - a for a, b in itertools.pairwise(starts) if b >= began and a <= ended]
    return max(gaps, default=0.0)


def batches_within(progresses: list[Any], window: tuple[float, float]) -> int:
    began, ended = window
    count = 0
    for progress in progresses:
        at = datetime.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        if progress.numInputRows and began <= at <= ended:
            count += 1
    return count


class Queries:
    """Streaming queries of one test, each named, every ``trigger``: reads into Parquet files (``batch`` messages a
    trigger unless ``maxMessagesPerTrigger`` says otherwise), and sinks fed by N rows of JSON files (one file of
    ``batch`` rows a trigger) whose ids are ``k0`` to ``k{N-1}``."""

    def __init__(self, spark: Any, tmp_path: Path, tag: str, trigger: str = TRIGGER, batch: int = BATCH, **common: str) -> None:
        self.spark, self.tmp_path, self.tag, self.trigger = spark, tmp_path, tag, trigger
        self.common = {"maxMessagesPerTrigger": str(batch), **common}
        self.running: dict[str, Any] = {}
        self.restarts: collections.Counter[str] = collections.Counter()
        self._writers: dict[str, Any] = {}
        self._before: dict[str, list[Any]] = collections.defaultdict(list)  # progress of a restarted query's runs
        self.rows = tmp_path / "rows"
        self.rows.mkdir()
        for f in range(N // batch):
            lines = (json.dumps({"body": f"k{f * batch + i}", "message_id": f"k{f * batch + i}"}) + "\n" for i in range(batch))
            (self.rows / f"{f}.json").write_text("".join(lines))

    def read(self, name: str, uri: str, **options: str) -> Any:
        if uri.startswith("amqp") and "queue" not in options:  # a stream over AMQP: where it asks what was not delivered
            options = {**whole_cluster().stream_port(uri), **options}
        df = self.spark.readStream.format("amqp").option("uri", uri).options(**{**self.common, **options}).load().select("message_id")
        writer = df.writeStream.format("parquet").option("path", str(self._dir(name)))
        return self._start(name, writer)

    def write(self, name: str, uri: str, **options: str) -> Any:
        rows = self.spark.readStream.schema("body string, message_id string").option("maxFilesPerTrigger", 1).json(str(self.rows))
        writer = rows.selectExpr("CAST(body AS BINARY) AS body", "message_id").writeStream.format("amqp").option("uri", uri)
        writer = writer.options(**{**{k: v for k, v in self.common.items() if k in SINK_OPTIONS}, **options})
        return self._start(name, writer)

    def _start(self, name: str, writer: Any) -> Any:
        """The query started and past its first batch. One at a time: each start launches Python workers, and Spark
        gives one 10 s to connect back (not configurable); on a loaded machine several at once took longer. A start
        that failed so is tried again (the checkpoint is still empty), at most three times."""
        writer = writer.option("checkpointLocation", str(self._dir(f"c-{name}"))).trigger(processingTime=self.trigger)
        writer = self._writers[name] = writer.queryName(f"{self._dir(name).name}-{self.tag}")  # failed() starts it again
        for attempt in range(3):
            query = self.running[name] = writer.start()
            deadline = time.monotonic() + 180
            while query.lastProgress is None and query.exception() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            error = query.exception()
            if error is None or SPARK_WORKER_START not in str(error) or query.lastProgress is not None:
                break
            print(f"query '{name}' failed to start (attempt {attempt + 1}): {str(error)[:200]}")
        return self.running[name]

    def progress(self, name: str) -> list[Any]:
        """Every progress report of the query, over its restarts."""
        return [*self._before[name], *self.running[name].recentProgress]

    def ids(self, name: str) -> list[str]:
        return ids(self.spark, self._dir(name))

    def _dir(self, name: str) -> Path:
        return self.tmp_path / re.sub(r"\W+", "-", name)

    def flowing(self) -> bool:
        """Whether every query has made a batch with rows: faults before that would test nothing in a slow start."""
        assert not self.failed(), self.failed()
        return all(any(p.numInputRows for p in q.recentProgress) for q in self.running.values())

    def failed(self) -> dict[str, str]:
        """The queries that failed, and why. One that failed as Spark's own start of a Python worker can (10 s to
        connect back, fixed, which a loaded machine missed) is started again from its checkpoint, as a production
        job is, twice at most; the connector's guarantees hold across it, and the test's checks still apply."""
        failed = {}
        for name, query in list(self.running.items()):
            error = query.exception()
            if error is None:
                continue
            if SPARK_WORKER_START in str(error) and self.restarts[name] < 2:
                self.restarts[name] += 1
                print(f"query '{name}' failed as Spark started a Python worker; restarted from its checkpoint: {str(error)[:300]}")
                self._before[name].extend(query.recentProgress)
                self.running[name] = self._writers[name].start()
                continue
            failed[name] = str(error)[:2000]
        return failed

    def stop(self) -> None:
        for query in self.running.values():
            query.stop()


def assert_once(got: list[str], prefix: str, what: str) -> None:
    counted = collections.Counter(got)
    assert sorted(counted) == sorted(f"{prefix}{i}" for i in range(N)), (what, len(counted))
    assert max(counted.values()) == 1, (what, [k for k, c in counted.items() if c > 1][:10])


def drain_ids(cluster: Cluster, queue: str) -> list[str]:
    """The message ids in ``queue``, taken off it."""
    ch = channel(cluster, "c1")
    got = []
    while True:
        method, props, _ = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(props.message_id)
    ch.connection.close()
    return got


READERS = {"queue": "q", "stream over the stream protocol": "s", "stream over AMQP 0-9-1": "s", "stream over AMQP 1.0": "s"}
SINKS = ("AMQP 0-9-1 sink", "stream sink", "AMQP 1.0 sink")


class EveryMode:
    """A fault test's queues for every mode at once: a quorum queue and a stream to read (N ids each, led by
    ``read_on``), and a quorum queue, a stream and another quorum queue for the three sinks to write (led by
    ``write_on``). Its queries are named by mode, and ``side`` after it where a test runs two sets; the quorum queue
    to read gets ``queue_arguments``."""

    def __init__(
        self,
        cluster: Cluster,
        prefix: str,
        tag: str,
        read_on: str = "c1",
        write_on: str = "c2",
        side: str = "",
        **queue_arguments: object,
    ) -> None:
        self.cluster, self.tag = cluster, tag
        self.readers = {f"{k} {side}".strip(): ids for k, ids in READERS.items()}
        self.sinks = tuple(f"{k} {side}".strip() for k in SINKS)
        self.q, self.s, self.out_q, self.out_s, self.out_q10 = (f"{prefix}.{k}.{tag}" for k in ("q", "s", "outq", "outs", "outq10"))
        declare(cluster, read_on, self.q, "quorum", **queue_arguments)
        declare(cluster, read_on, self.s, "stream")
        for name, kind in ((self.out_q, "quorum"), (self.out_s, "stream"), (self.out_q10, "quorum")):
            declare(cluster, write_on, name, kind)
        preload(cluster, self.q, "q")
        preload(cluster, self.s, "s")

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.readers, *self.sinks)

    def start(self, run: Queries, amqp: str, stream: str, **stream_protocol: str) -> None:
        """The seven queries, through ``amqp`` and ``stream`` (``stream_protocol``: options of the two queries over
        the stream protocol)."""
        queue, over_stream, over_amqp, over_amqp10 = self.readers
        run.read(queue, amqp, queue=self.q, journalLocation=str(run.tmp_path / f"journal-{self.q}"))
        run.read(over_stream, stream, stream=self.s, **stream_protocol)
        run.read(over_amqp, amqp, stream=self.s)
        run.read(over_amqp10, amqp, stream=self.s, protocol="amqp1.0")
        amqp_sink, stream_sink, amqp10_sink = self.sinks
        run.write(amqp_sink, amqp, routingKey=self.out_q)
        run.write(stream_sink, stream, stream=self.out_s, **stream_protocol)
        run.write(amqp10_sink, amqp, routingKey=self.out_q10, protocol="amqp1.0")

    def caught_up(self, run: Queries, failing: tuple[str, ...] = ()) -> bool:
        """Whether every query has taken N rows by its progress (a query of ``failing`` may have failed)."""
        failed = {k: v for k, v in run.failed().items() if k not in failing}
        assert not failed, failed
        # Counted from the queries' progress, not their files: reading every query's Parquet files at each poll ran
        # Spark jobs every two seconds through a test. A batch's progress comes once it is committed; a batch read
        # twice counts twice, and assert_delivered then finds the ids missing or repeated.
        return all(sum(p.numInputRows for p in run.progress(k)) >= N for k in (*self.sinks, *self.readers))

    def counts(self, run: Queries) -> dict[str, int]:
        """The ids each read has written so far, for a test's failure message."""
        return {k: len(run.ids(k)) for k in self.readers}

    def assert_delivered(self, spark: Any, run: Queries) -> None:
        """Every id once in every read and in the stream sink's stream, at least once in the AMQP sinks' queues."""
        for name, prefix in self.readers.items():
            assert_once(run.ids(name), prefix, name)
        written = spark.read.format("amqp").option("uri", self.cluster.url).options(**self.cluster.stream_port())
        written = written.option("stream", self.out_s).load()
        assert_once([r["message_id"] for r in written.select("message_id").collect()], "k", self.sinks[1])  # deduplicated
        for name, queue in ((self.sinks[0], self.out_q), (self.sinks[2], self.out_q10)):
            assert sorted(set(drain_ids(self.cluster, queue))) == sorted(f"k{i}" for i in range(N)), name  # at least once

    def delete(self) -> None:
        """The queues and streams, deleted at the end of the test whatever happened in it (request.addfinalizer): a
        quorum queue a failed test left behind, with members on a node since lost, held up every later drain of the
        cluster by two minutes."""
        self.cluster.delete(self.q, self.s, self.out_q, self.out_s, self.out_q10)


class Faults(threading.Thread):
    """A test's faults, in a thread of their own while its queries run (``plan``), each timed as a window of
    wall-clock time for ``assert_no_stall``; what the plan raises is kept for the test to report."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.windows: dict[str, tuple[float, float]] = {}
        self.error: BaseException | None = None

    def plan(self) -> None:
        raise NotImplementedError

    @contextmanager
    def window(self, what: str) -> Iterator[None]:
        began = time.time()
        yield
        self.windows[what] = (began, time.time())

    def run(self) -> None:
        try:
            self.plan()
        except BaseException as err:  # the test reports it; its fixture undoes the fault
            self.error = err

    def done(self, timeout: float) -> None:
        self.join(timeout=timeout)
        assert self.error is None and not self.is_alive(), self.error


def assert_no_stall(
    run: Queries, windows: dict[str, tuple[float, float]], deadline: float, but: tuple[str, ...] = (), of: tuple[str, ...] = ()
) -> None:
    """Prints the longest pause of every query (of ``of``, if given) around each window; none but ``but`` may reach
    ``deadline``."""
    for what, window in windows.items():
        measured = {k: round(pause(run.progress(k), window), 1) for k in run.running if not of or k in of}
        print(f"\nlongest pause between batches around '{what}' (s): {measured}")
        stalled = {k: p for k, p in measured.items() if k not in but and p >= deadline}
        assert not stalled, (what, stalled)
