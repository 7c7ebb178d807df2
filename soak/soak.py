"""A week in an hour: every mode at once against the 3-node cluster, with a random fault every few minutes, and a
report of rows, losses, duplicates, pauses and memory. Not a test and not in CI: run it by hand (``make soak``).

    python soak/soak.py [--minutes 60] [--every 180] [--seed N] [--out DIR]

The queue and the stream are fed at ``--rate`` ids a second by producers outside Spark, and the sinks by JSON files
of rows. Seven queries run on ``local-cluster`` (executors in JVMs of their own, so one can be SIGKILLed): the queue
(journalled), the stream over the stream protocol (through HAProxy, ``loadBalancer=true``), over AMQP 0-9-1 and
AMQP 1.0, and the three sinks (the stream sink through HAProxy too). A query that fails is started again from its
checkpoint, as a job's retry would, and counted. Every minute the resident memory of the driver, the source runners,
the Python workers and the executors is sampled. At the end the producers stop, the reads catch up, and the report
(Markdown) goes to ``<out>/report.md`` and to standard output.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import os
import random
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faults import Faults, tool
from memory import Memory
from traffic import Drainer, Feeder, Producer, stream_ids

READS = ("queue", "stream over the stream protocol", "stream over AMQP 0-9-1", "stream over AMQP 1.0")
SINKS = ("AMQP 0-9-1 sink", "stream sink", "AMQP 1.0 sink")


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        from pyspark.sql import SparkSession

        self.out = Path(args.out).resolve()  # absolute: executors run in a directory of their own
        self.tag = uuid.uuid4().hex[:8]
        self.amqp, self.stream = tool("rabbitmq", "cluster-url"), tool("haproxy", "stream-url")
        self.nodes = [f"amqp://guest:guest@127.0.0.1:{p}/%2F" for p in (5701, 5702, 5703)]
        self.q, self.s, self.out_q, self.out_s, self.out_q10 = (f"soak.{k}.{self.tag}" for k in ("q", "s", "outq", "outs", "outq10"))
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the master, the workers and their executors: on loopback too
        builder = SparkSession.builder.appName("spark-amqp soak").master("local-cluster[2,2,1024]")
        for key, value in {
            "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.numRecentProgressUpdates": "100", "spark.task.maxFailures": "8", "spark.ui.showConsoleProgress": "false",
        }.items():  # fmt: skip
            builder = builder.config(key, value)
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("ERROR")
        self.memory = Memory(os.getpid())
        self.queries: dict[str, Any] = {}
        self.starts: dict[str, Any] = {}
        self.failures: list[tuple[float, str, str]] = []
        self.batches: dict[str, dict[int, float]] = {k: {} for k in (*READS, *SINKS)}  # batch id: start, with rows
        self.rows: dict[str, dict[int, int]] = {k: {} for k in (*READS, *SINKS)}  # batch id: rows (a rerun replaces)

    def declare(self) -> None:
        import pika

        ch = pika.BlockingConnection(pika.URLParameters(self.nodes[0])).channel()
        for name, kind in (
            (self.q, "quorum"),
            (self.s, "stream"),
            (self.out_q, "quorum"),
            (self.out_s, "stream"),
            (self.out_q10, "quorum"),
        ):
            args: dict[str, Any] = {"x-queue-type": kind}
            if kind == "stream":
                args["x-max-length-bytes"] = 2_000_000_000  # well above its segments (500 MB), below the disk
            ch.queue_declare(name, durable=True, arguments=args)
        ch.connection.close()

    def define(self) -> None:
        common = {"heartbeat": "10", "connectionTimeout": "5", "brokerOutageTimeout": "3m"}
        work = self.out
        rows = work / "rows"
        rows.mkdir(parents=True, exist_ok=True)

        def read(name: str, uri: str, **options: str) -> None:
            df = self.spark.readStream.format("amqp").option("uri", uri).options(**common, maxMessagesPerTrigger="1000", **options)
            self.starts[name] = df.load().select("message_id").writeStream.format("parquet").option("path", str(work / _dir(name)))

        def write(name: str, uri: str, **options: str) -> None:
            src = self.spark.readStream.schema("body string, message_id string").option("maxFilesPerTrigger", 5).json(str(rows))
            sink = src.selectExpr("CAST(body AS BINARY) AS body", "message_id").writeStream.format("amqp").option("uri", uri)
            self.starts[name] = sink.options(**common, **options)

        read("queue", self.amqp, queue=self.q, journalLocation=str(work / "journal"))
        read("stream over the stream protocol", self.stream, stream=self.s, loadBalancer="true")
        # Over AMQP, what RabbitMQ did not deliver is asked on the stream port of the uri's first node (here each node
        # has ports of its own; 5552 is another broker's).
        port = str(urllib.parse.urlsplit(tool("rabbitmq", "stream-url", "c1")).port)
        read("stream over AMQP 0-9-1", self.amqp, stream=self.s, streamPort=port)
        read("stream over AMQP 1.0", self.amqp, stream=self.s, protocol="amqp1.0", streamPort=port)
        write("AMQP 0-9-1 sink", self.amqp, routingKey=self.out_q)
        write("stream sink", self.stream, stream=self.out_s, loadBalancer="true")
        write("AMQP 1.0 sink", self.amqp, routingKey=self.out_q10, protocol="amqp1.0")

    def start(self, name: str) -> None:
        before = self.memory.runner_pids()
        writer = self.starts[name].option("checkpointLocation", str(self.out / f"c-{_dir(name)}"))
        self.queries[name] = writer.trigger(processingTime="4 seconds").queryName(_dir(name)).start()
        if name in READS:  # only a read has a source runner
            self.memory.adopt(name, before)

    def watch(self, elapsed: float) -> None:
        """Batches with rows, by id and start; a failed query is logged and started again from its checkpoint."""
        for name, query in self.queries.items():
            for progress in query.recentProgress:
                if progress.numInputRows:
                    started = datetime.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
                    self.batches[name][progress.batchId] = started
                    self.rows[name][progress.batchId] = progress.numInputRows
            if not query.isActive:
                error = str(query.exception())[:600]
                self.failures.append((elapsed, name, error))
                print(f"[{elapsed / 60:5.1f} min] {name} failed, started again: {error[:300]}", flush=True)
                self.start(name)

    def restarts(self, name: str) -> int:
        return sum(1 for _, failed, _ in self.failures if failed == name)

    def pause(self, name: str, within: tuple[float, float] | None = None) -> float:
        starts = sorted(self.batches[name].values())
        gaps = list(itertools.pairwise(starts))
        if within:
            gaps = [(a, b) for a, b in gaps if b >= within[0] and a <= within[1]]
        return max((b - a for a, b in gaps), default=0.0)


class Schedule(threading.Thread):
    """A random fault every ``every`` seconds (±30 %), one at a time, each window kept, beside the main loop (which
    samples memory and restarts failed queries meanwhile). The last fault started is finished before it stops."""

    def __init__(self, faults: Faults, every: float, seed: int, began: float) -> None:
        super().__init__(daemon=True)
        self.faults, self.every, self.rng, self.began = faults, every, random.Random(seed + 1), began
        self.windows: list[tuple[str, str, float, float]] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every * self.rng.uniform(0.7, 1.3)):
            kind, fault = self.faults.pick()
            at = time.time()
            print(f"[{(at - self.began) / 60:5.1f} min] fault: {kind} ...", flush=True)
            try:
                what = fault()  # type: ignore[operator]
            except Exception as err:  # a tool that failed: reported, and the cluster put back before the next
                what = f"failed: {err}"
                self.errors.append(f"{kind}: {err}")
                self.faults.restore()
            self.windows.append((kind, what, at, time.time()))
            print(f"[{(time.time() - self.began) / 60:5.1f} min] fault over: {what}", flush=True)


def _dir(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--every", type=float, default=180, help="seconds between faults (±30%%)")
    p.add_argument("--rate", type=float, default=20, help="ids a second into the queue, the stream and the sinks")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=f".cache/soak/{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    soak = Soak(args)
    soak.declare()
    soak.define()
    faults = Faults(random.Random(seed), (soak.s, soak.out_s), os.getpid())
    producers = [Producer(soak.nodes, soak.q, "q", args.rate), Producer(soak.nodes, soak.s, "s", args.rate)]
    feeder = Feeder(soak.out / "rows", args.rate)
    drainers = {"AMQP 0-9-1 sink": Drainer(soak.nodes, soak.out_q), "AMQP 1.0 sink": Drainer(soak.nodes, soak.out_q10)}
    memory = soak.memory
    for thread in (*producers, feeder, *drainers.values()):
        thread.start()
    began = time.time()
    for name in soak.starts:
        soak.start(name)
        time.sleep(3)  # one at a time: Spark gives each new Python worker 10 s to connect back
    print(f"soak {soak.tag}, seed {seed}: {args.minutes} min, a fault every ~{args.every:.0f} s", flush=True)
    schedule = Schedule(faults, args.every, seed, began)
    schedule.start()
    next_sample = time.time()
    end = began + args.minutes * 60
    try:
        while time.time() < end:
            soak.watch(time.time() - began)
            if time.time() >= next_sample:
                print(memory.sample(time.time() - began), flush=True)
                next_sample += 60
            time.sleep(2)
    finally:
        schedule.stopping.set()
        schedule.join()
        faults.restore()
    for producer in producers:
        producer.stopping.set()
    feeder.stopping.set()
    for producer in producers:
        producer.join(60)
    feeder.join(60)
    print("faults over; the reads catch up ...", flush=True)
    wanted = {"q": producers[0].confirmed, "s": producers[1].confirmed}
    deadline = time.time() + 900
    while time.time() < deadline:
        soak.watch(time.time() - began)
        got = {name: _ids(soak, name) for name in READS}
        sunk = all(sum(soak.rows[k].values()) >= feeder.fed for k in SINKS)
        if all(wanted["q" if n == "queue" else "s"] <= set(got[n]) for n in READS) and sunk:
            break
        time.sleep(10)
    time.sleep(30)  # the drainers take the last of the AMQP sinks' messages
    for query in soak.queries.values():
        query.stop()
    for drainer in drainers.values():
        drainer.stopping.set()
        drainer.join(60)
    report = _report(soak, args, seed, began, producers, feeder, drainers, schedule, memory)
    (Path(args.out) / "report.md").write_text(report)
    print(report)


def _ids(soak: Soak, name: str) -> list[str]:
    path = soak.out / _dir(name)
    if not list(path.glob("*.parquet")):
        return []
    return [r["message_id"] for r in soak.spark.read.parquet(str(path)).select("message_id").collect()]


def _report(soak, args, seed, began, producers, feeder, drainers, schedule, memory) -> str:  # type: ignore[no-untyped-def]
    lines = [f"## Soak {time.strftime('%Y-%m-%d', time.gmtime(began))}: {args.minutes:.0f} min, seed {seed}", ""]
    lines += [
        f"RabbitMQ {tool('rabbitmq', 'version', 'c1')} (3 nodes), a fault every {args.every:.0f} s ±30 %, {args.rate:.0f} ids/s per input.",
        "",
    ]
    lines += [
        "| mode | rows in | rows out | lost | duplicates | longest pause (s) | restarts |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in READS:
        producer = producers[0] if name == "queue" else producers[1]
        counted = collections.Counter(_ids(soak, name))
        lost = len(producer.confirmed - set(counted))
        dups = sum(c - 1 for k, c in counted.items() if c > 1 and k not in producer.resent)
        lines.append(
            f"| {name} | {len(producer.confirmed)} | {sum(counted.values())} | {lost} | {dups} | {soak.pause(name):.1f} | {soak.restarts(name)} |"
        )
    fed = {f"k{i}" for i in range(feeder.fed)}
    outputs = {"stream sink": stream_ids(soak.nodes[0], soak.out_s), **{k: d.got for k, d in drainers.items()}}
    for name in SINKS:
        counted = outputs[name]
        dups = sum(c - 1 for c in counted.values() if c > 1)
        lines.append(
            f"| {name} | {feeder.fed} | {sum(counted.values())} | {len(fed - set(counted))} | {dups} | {soak.pause(name):.1f} | {soak.restarts(name)} |"
        )
    lines += ["", "Duplicates in a read exclude ids a producer itself sent twice (a publish whose confirm it never saw):"]
    lines += [f"{sum(len(p.resent) for p in producers)} such ids. The AMQP sinks are at least once; the stream sink deduplicates.", ""]
    errors = {f"producer {p.queue}": dict(p.errors) for p in producers} | {f"drainer {k}": dict(d.errors) for k, d in drainers.items()}
    lines += [f"Errors the traffic outside Spark reconnected after: {json.dumps(errors)}", ""]
    lines += ["| min | fault | input's own pause (s) | longest pause around it (s), by mode |", "| --- | --- | --- | --- |"]
    for kind, what, a, b in schedule.windows:
        pauses = ", ".join(f"{n.split(' over ')[-1] if ' over ' in n else n}: {soak.pause(n, (a, b)):.0f}" for n in (*READS, *SINKS))
        fed = max(p.pause((a, b)) for p in producers)
        lines.append(f"| {(a - began) / 60:.0f} | {kind}: {what} | {fed:.0f} | {pauses} |")
    lines += ["", *memory.table(), ""]
    lines += ["Each read's source runner (MiB):", "", *memory.runner_table(), ""]
    growth = memory.growth()
    if growth:
        lines += [
            "Mean resident memory in the last quarter of the run over the second quarter: "
            + ", ".join(f"{role} {ratio:.2f}" for role, ratio in growth.items())
            + ".",
            "",
        ]
    if schedule.errors:
        lines += ["Faults whose tools failed (the cluster was put back):", "", *(f"- {e[:300]}" for e in schedule.errors), ""]
    if soak.failures:
        lines += ["Queries that failed and were started again:", ""]
        lines += [f"- {t / 60:.1f} min, {name}: {error[:300]}" for t, name, error in soak.failures]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
