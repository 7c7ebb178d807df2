"""Queue mode's throughput against raw pika and RabbitMQ's PerfTest on the same queue, in the same run.

    make perftest   # PerfTest's jars into .cache/perftest (Maven), once
    AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5690/%2F .venv/bin/python benchmarks/source_throughput.py
    # source -> Delta against source -> noop (Delta runs on the Delta line's PySpark):
    AMQP_TEST_URL=... .venv-pyspark4.2/bin/python benchmarks/source_throughput.py --sinks noop,delta,noop,delta --journal-pairs 2

For each sink in ``--sinks`` it preloads ``--messages`` x 200-byte messages and reads them with
Trigger.AvailableNow and the source's default batch size (``--max-per-trigger`` to set one). The
rate is the rows over the batches' processing time (from the query's progress), *steady* leaving out
the first batch, which also pays for the query's first Python worker and holds whatever had
arrived. Baselines on the same queue contents, before the first sink and after each one (each sink
is compared with the mean of the runs around it; the machine's pace drifts):

- raw pika: SelectConnection, prefetch 1000, a multi-ack every 1000;
- PerfTest (Java), prefetch 1000, a multi-ack every 1000: the broker's limit with the best client;
- PerfTest with the source's own ack pattern: its prefetch, and one multi-ack per batch (the
  source holds a batch unacknowledged until Spark commits it): the broker's limit for that pattern;
- python-qpid-proton (AMQP 1.0's reference client, when installed: ``pip install python-qpid-proton``), credit
  1000, each delivery accepted: the baseline of a sink written ``noop@amqp1.0``, whose source reads over AMQP 1.0
  (the run prints its median against the same sink over AMQP 0-9-1).

Each run also reports where the time goes: the CPU per message of each process group (the measured
RabbitMQ node, the source runner on the driver, Spark's JVM, the executors' Python workers, the
baseline client) from /proc, and the median time of each phase of a steady batch from Spark's
progress (latestOffset: the source's planning, waiting for deliveries included; walCommit and
commitOffsets: Spark's offset and commit logs; addBatch: the tasks and the sink).

Delta, not the source, sets the pace into Delta: after each ``delta`` run, Spark's own
``rate-micro-batch`` source (no connector at all) writes the same number of rows into Delta at the
same batch size, with the source's own columns (a 200-byte body, the queue, no properties), and the
run prints source -> Delta against rate-micro-batch -> Delta, the ceiling, as well as against
source -> noop.

``--journal-pairs N`` adds N pairs of Delta runs without and with ``journalLocation`` in ABBA order
(Delta keeps getting faster as the JVM warms up): the journal's cost is the ratio of their medians.
``--backlog N`` reads a backlog of N messages and samples the source runner's resident memory,
which must stay flat (bounded by the prefetch, not the backlog).

``--shape producer`` fills the queue with producer-like messages instead (benchmarks/shapes.py: each its own
message id, correlation id and timestamp, a type, an app id, a content type, three headers, a ~200-byte JSON
body), and ``--shape both`` runs every sink on both shapes side by side (in alternating order), each against
its own baselines on the same queue contents, and ends with their medians, ratios and CPU per message
(``--baselines pattern`` keeps only PerfTest with the source's pattern, to keep a run short).

Without AMQP_TEST_URL it runs against the embedded broker in its own process (no PerfTest then).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import pika_baseline as pb
import shapes
from machine import BROKER_PIDS, PERFTEST_DIR, RUNNER, CpuMeter, listening_pid, perftest
from spark_runs import BatchLog, run_to_end, spark_session

from spark_amqp.queues.options import parse_source_options

try:  # the AMQP 1.0 reference client, when installed (see benchmarks/amqp10_client.py): the baseline of @amqp1.0 runs
    import amqp10_client
    import proton  # noqa: F401

    PROTON = True
except ImportError:
    PROTON = False
from spark_amqp.reading.arrow import SCHEMA_DDL

BODY = b"x" * 200
PHASES = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets")


def runner_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if RUNNER.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


class RssSampler:
    """Samples the source runner's RSS every 0.5 s while a query runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for pid in runner_pids():
                with contextlib.suppress(OSError, RuntimeError):
                    self.samples.append((time.monotonic() - self._start, pb.rss_bytes(pid)))

    @property
    def peak(self) -> int:
        return max((rss for _, rss in self.samples), default=0)


class Run:
    """One AvailableNow run of the source into a sink: its batches, rates and where the time went."""

    def __init__(self, log: BatchLog, wall: float, cpu: CpuMeter) -> None:
        self.rows = log.rows
        self.batches = log.batches
        self.wall = wall
        self.cpu = cpu
        steady = self.batches[1:]
        self.all_rate = log.rows / log.seconds
        self.steady = sum(b[0] for b in steady) / sum(b[1] for b in steady) if steady else self.all_rate
        phases: dict[str, list[int]] = {}
        for progress in log.query.recentProgress[1:]:
            if progress.numInputRows:
                for phase in PHASES:
                    phases.setdefault(phase, []).append(progress.durationMs.get(phase, 0))
        self.phases = {p: statistics.median(v) for p, v in phases.items()}
        self.sizes = [b[0] for b in self.batches]

    def where(self) -> str:
        phases = ", ".join(f"{p} {ms:.0f}" for p, ms in self.phases.items())
        sizes = statistics.median(self.sizes[1:] or self.sizes)
        return f"{len(self.batches)} batches (median {sizes:.0f} rows); a steady batch's phases in ms (medians): {phases}"


def stream_once(spark, url: str, queue: str, sink: str, options: dict[str, str], workdir: str) -> Run:  # type: ignore[no-untyped-def]
    """One AvailableNow run into ``sink``; ``noop@amqp1.0`` (any sink): the source reads over AMQP 1.0."""
    sink, _, protocol = sink.partition("@")
    if protocol:
        options = {**options, "protocol": protocol}
    run = f"{sink}-{time.monotonic_ns()}"
    reader = spark.readStream.format("amqp").option("uri", url).option("queue", queue).options(**options)
    if sink.endswith("+journal"):
        reader = reader.option("journalLocation", os.path.join(workdir, f"journal-{run}"))
    writer = reader.load().writeStream.option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}")).trigger(availableNow=True)
    if sink == "noop":
        writer = writer.format("noop")
    else:
        writer = writer.format(sink.split("+")[0]).option("path", os.path.join(workdir, f"out-{run}"))
    with CpuMeter() as cpu:
        log, wall = run_to_end(spark, writer)
    return Run(log, wall, cpu)


def rate_to_delta(spark, rows: int, per_batch: int, workdir: str) -> Run:  # type: ignore[no-untyped-def]
    """Spark's rate-micro-batch source into Delta, ``per_batch`` rows a batch, until ``rows`` are written: no connector."""
    run = f"rate-{time.monotonic_ns()}"
    rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch).option("numPartitions", 2).load()
    frame = rate.selectExpr(*_source_row(spark))
    writer = frame.writeStream.format("delta").option("path", os.path.join(workdir, f"out-{run}"))
    writer = writer.option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}"))
    with CpuMeter() as cpu:
        start = time.perf_counter()
        query = writer.start()
        log = BatchLog(query)
        while log.rows < rows and query.isActive:
            time.sleep(0.2)  # a benchmark's poll of the progress, not a test's wait
        wall = time.perf_counter() - start
        query.stop()
        query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    return Run(log, wall, cpu)


def _source_row(spark) -> list[str]:  # type: ignore[no-untyped-def]
    """The source's own columns, as it gives the benchmark's messages (a body, the queue, no properties), made from
    a rate row: Delta's cost a row depends on the columns it writes."""
    made = {
        "body": f"CAST(repeat('x', {len(BODY)}) AS BINARY)",
        "queue": "'bench.source'",
        "exchange": "''",
        "routing_key": "'bench.source'",
        "delivery_tag": "value",
        "redelivered": "false",
    }
    schema = spark.createDataFrame([], SCHEMA_DDL).schema
    return [f"{made.get(f.name, f'CAST(NULL AS {f.dataType.simpleString()})')} AS {f.name}" for f in schema.fields]


PUBLISH_OVER = ["amqp0-9-1"]  # --publish-over: RabbitMQ converts a message for a consumer of the other protocol


def preload(url: str, queue: str, count: int, shape: str = "body-only") -> None:
    """``count`` messages of ``shape`` (shapes.py) into ``queue``, over ``--publish-over``."""
    pb.declare(url, queue)
    if PUBLISH_OVER[0] == "amqp1.0":
        import asyncio

        from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
        from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
        from spark_amqp.sink.options import parse_sink_options

        # Transient, as pika's are (no properties): only the protocol differs.
        opts = parse_sink_options({"uri": url, "protocol": "amqp1.0", "routingKey": queue, "maxInFlight": "2000", "persistent": "false"})
        batches = list(shapes.arrow_batches(shape, count, 50_000))
        asyncio.run(Amqp10PartitionPublisher(opts, Amqp10MessageBuilder(opts)).publish(batches, "preload"))
        return
    if shape == "body-only":
        pb.publish_async(url, queue, count, BODY, window=2000)
    else:
        pb.publish_async(url, queue, count, shapes.producer_body, window=2000, properties=shapes.pika_properties)


def perftest_consume(jars: Path, url: str, queue: str, count: int, prefetch: int, ack_every: int) -> float:
    """PerfTest's average rate (msg/s) draining ``count`` preloaded messages with one consumer."""
    out = perftest(
        jars,
        url,
        *("--predeclared", "--queue", queue, "--producers", "0", "--consumers", "1"),
        *("--qos", str(prefetch), "--multi-ack-every", str(ack_every), "--cmessages", str(count), "--time", "600"),
    )
    found = re.search(r"receiving rate avg: (\d+) msg/s", out)
    if "Consumer reached message limit" not in out or not found:
        raise RuntimeError(f"PerfTest did not read {count} messages:\n{out[-2000:]}")
    return float(found.group(1))


BASELINES = {"pika": "pika", "proton": "proton (AMQP 1.0)", "perftest": "PerfTest", "pattern": "PerfTest, source's pattern"}


class Baselines:
    """The baseline clients on the same queue contents (messages of ``shape``); each measurement is kept, with its CPU."""

    def __init__(
        self,
        url: str,
        queue: str,
        count: int,
        jars: Path | None,
        prefetch: int,
        batch: int,
        shape: str = "body-only",
        only: tuple[str, ...] = tuple(BASELINES),
    ) -> None:
        self.url, self.queue, self.count, self.jars, self.shape = url, queue, count, jars, shape
        self.kinds = {}
        if "pika" in only:
            self.kinds["pika"] = (1000, 1000)
        if PROTON and "proton" in only:
            self.kinds["proton (AMQP 1.0)"] = (1000, 1)
        if jars is not None and "perftest" in only:
            self.kinds["PerfTest"] = (1000, 1000)
        if jars is not None and "pattern" in only:
            self.kinds["PerfTest, source's pattern"] = (prefetch, batch)
        self.rates: dict[str, list[float]] = {k: [] for k in self.kinds}
        self.cpu: dict[str, list[dict[str, float]]] = {k: [] for k in self.kinds}  # CPU us/msg per group, per measurement

    def measure(self, when: str) -> None:
        for kind, (prefetch, ack_every) in self.kinds.items():
            preload(self.url, self.queue, self.count, self.shape)
            with CpuMeter() as cpu:
                if kind == "pika":
                    rate = self.count / pb.consume(self.url, self.queue, self.count, prefetch=prefetch, ack_every=ack_every)
                elif kind.startswith("proton"):
                    start = time.perf_counter()
                    amqp10_client.proton_consume(self.url, self.queue, self.count)
                    rate = self.count / (time.perf_counter() - start)
                else:
                    assert self.jars is not None
                    rate = perftest_consume(self.jars, self.url, self.queue, self.count, prefetch, ack_every)
            self.rates[kind].append(rate)
            self.cpu[kind].append(cpu.per_message(self.count))
            print(
                f"{kind} (prefetch {prefetch}, a multi-ack every {ack_every}), {self.shape} messages, {when}: {rate:9,.0f} msg/s\n"
                f"    {cpu.summary(self.count)}"
            )

    def around(self, kind: str) -> float:
        """The mean of the last two measurements: the one before a sink's run and the one after it."""
        return statistics.mean(self.rates[kind][-2:])


def median_cpu(per_run: list[dict[str, float]]) -> dict[str, float]:
    """The median CPU us/msg of each group over runs (0 where a run's group used next to nothing)."""
    groups = [g for g in CpuMeter.GROUPS if any(g in run for run in per_run)]
    medians = {g: statistics.median(run.get(g, 0.0) for run in per_run) for g in groups}
    return {g: us for g, us in medians.items() if us >= 0.05}


def cpu_text(per: dict[str, float]) -> str:
    return ", ".join(f"{g} {us:.1f}" for g, us in per.items()) + f"; total {sum(per.values()):.1f}"


def report_shapes(shaped: dict[tuple[str, str], list[tuple[Run, dict[str, float]]]], bases: dict[str, Baselines], count: int) -> None:
    """Each sink's runs on both shapes side by side: medians of the steady rates, of the ratios, of the CPU us/msg."""
    for sink in dict.fromkeys(k for k, _ in shaped):
        print(f"\nproducer-like against body-only messages, source -> {sink} (medians over the runs of each shape):")
        medians: dict[str, float] = {}
        for shape, base in bases.items():
            runs = shaped.get((sink, shape), [])
            if not runs:
                continue
            medians[shape] = statistics.median(r.steady for r, _ in runs)
            ratios = ", ".join(f"{statistics.median(x[k] for _, x in runs):.2f}x {k}" for k in base.kinds)
            print(
                f"  {shape:9s}: source steady {medians[shape]:7,.0f} msg/s ({len(runs)} runs: "
                f"{', '.join(f'{r.steady:,.0f}' for r, _ in runs)}) = {ratios}\n"
                f"    source's CPU us/msg: {cpu_text(median_cpu([r.cpu.per_message(r.rows) for r, _ in runs]))}"
            )
            for kind in base.kinds:
                print(
                    f"    {kind}: {statistics.median(base.rates[kind]):7,.0f} msg/s (median of {len(base.rates[kind])}); "
                    f"CPU us/msg: {cpu_text(median_cpu(base.cpu[kind]))}"
                )
        if len(medians) == 2:
            body, producer = medians["body-only"], medians["producer"]
            kinds = [k for k in bases["body-only"].kinds if k in bases["producer"].kinds]
            theirs = ", ".join(
                f"{k} {statistics.median(bases['producer'].rates[k]) / statistics.median(bases['body-only'].rates[k]):.2f}x" for k in kinds
            )
            print(f"  producer-like / body-only: the source {producer / body:.2f}x; {theirs}")


@contextlib.contextmanager
def broker_url() -> Iterator[tuple[str, str]]:
    real = os.environ.get("AMQP_TEST_URL")
    if real:
        node = listening_pid(urllib.parse.urlsplit(real).port or 5672)
        if node is not None:
            BROKER_PIDS.add(node)  # other RabbitMQ nodes on the machine count as other jobs
        yield real, "RabbitMQ"
    else:
        with pb.embedded_broker_process() as (url, pid):
            BROKER_PIDS.add(pid)
            yield url, "embedded broker"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--max-per-trigger", type=int, default=None, help="maxMessagesPerTrigger (default: the source's own)")
    parser.add_argument(
        "--sinks",
        default="noop,noop,noop",
        help="comma-separated: noop, parquet, delta, delta+journal; with @amqp1.0 the source reads over AMQP 1.0",
    )
    parser.add_argument("--journal-pairs", type=int, default=0, help="pairs of delta runs without and with the journal")
    parser.add_argument("--backlog", type=int, default=0, help="messages for the memory check (0 to skip)")
    parser.add_argument("--perftest-jars", type=Path, default=PERFTEST_DIR)
    parser.add_argument(
        "--publish-over", choices=("amqp0-9-1", "amqp1.0"), default="amqp0-9-1", help="the protocol the queue is filled over"
    )
    parser.add_argument(
        "--shape",
        choices=("body-only", "producer", "both"),
        default="body-only",
        help="the messages (benchmarks/shapes.py): PerfTest-like bodies, producer-like messages with their own properties, "
        "or both, side by side for every sink run (in alternating order) with their own baselines",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma-separated, of: {', '.join(BASELINES)} (pattern: PerfTest, source's pattern)",
    )
    args = parser.parse_args()
    shape_list = list(shapes.SHAPES) if args.shape == "both" else [args.shape]
    only = tuple(b for b in args.baselines.split(",") if b)
    if set(only) - set(BASELINES):
        parser.error(f"--baselines: unknown {', '.join(sorted(set(only) - set(BASELINES)))}")
    PUBLISH_OVER[0] = args.publish_over
    options = {} if args.max_per_trigger is None else {"maxMessagesPerTrigger": str(args.max_per_trigger)}
    chosen = parse_source_options({"uri": "amqp://h/", "queue": "q", **options})
    prefetch, batch = chosen.prefetch, chosen.trigger.max_messages or chosen.prefetch
    spark = spark_session("spark-amqp source benchmark")
    workdir = tempfile.mkdtemp(prefix="amqp-bench-")
    queue = "bench.source"
    try:
        with broker_url() as (url, label):
            jars = args.perftest_jars.resolve() if label == "RabbitMQ" and args.perftest_jars.is_dir() else None
            with open("/proc/loadavg") as f:
                load = " ".join(f.read().split()[:3])
            print(
                f"{args.messages} messages of {' and '.join(f'{s} ({shapes.mean_body_size(s):.0f} B bodies)' for s in shape_list)} on {label}, "
                f"published over {args.publish_over}; the source's batches: at most {batch} messages, prefetch {prefetch}; "
                f"load average {load}; {os.cpu_count()} CPUs"
            )
            if jars is None and label == "RabbitMQ":
                print(f"no PerfTest baseline: its jars are not in {args.perftest_jars} (make perftest)")
            for shape in shape_list:  # warm up the JVM and Python workers; not measured
                preload(url, queue, 20_000, shape)
                stream_once(spark, url, queue, "noop", options, workdir)
            if any(s.startswith("delta") for s in args.sinks.split(",")) or args.journal_pairs:
                preload(url, queue, 20_000)  # Delta's first write in a JVM loads and compiles a lot
                stream_once(spark, url, queue, "delta", options, workdir)
            bases = {shape: Baselines(url, queue, args.messages, jars, prefetch, batch, shape, only) for shape in shape_list}
            for b in bases.values():
                b.measure("before")
            pairs = [("delta", "delta+journal") if i % 2 == 0 else ("delta+journal", "delta") for i in range(args.journal_pairs)]
            sinks = [s for s in args.sinks.split(",") if s] + [sink for pair in pairs for sink in pair]
            steady: dict[str, list[float]] = {}
            rates: dict[str, list[float]] = {}
            shaped: dict[tuple[str, str], list[tuple[Run, dict[str, float]]]] = {}  # (sink, shape): each run, its ratios
            # Every other sink: the shapes in the other order (the machine drifts).
            order = [(sink, shape) for j, sink in enumerate(sinks) for shape in (shape_list if j % 2 == 0 else shape_list[::-1])]
            for sink, shape in order:
                base = bases[shape]
                preload(url, queue, args.messages, shape)
                run = stream_once(spark, url, queue, sink, options, workdir)
                assert run.rows == args.messages, f"{sink}, {shape}: read {run.rows} of {args.messages}"
                if shape == shape_list[0]:
                    steady.setdefault(sink, []).append(run.steady)
                    rates.setdefault(sink, []).append(run.all_rate)
                base.measure("after")
                ratios = {k: run.steady / base.around(k) for k in base.kinds}
                shaped.setdefault((sink, shape), []).append((run, ratios))
                print(
                    f"source -> {sink:13s}, {shape} messages: steady {run.steady:7,.0f} msg/s = "
                    f"{', '.join(f'{r:.2f}x {k}' for k, r in ratios.items())} (means of the runs around it); "
                    f"all batches {run.all_rate:7,.0f} msg/s; incl. query start-up {run.rows / run.wall:7,.0f} msg/s ({run.wall:4.1f} s)\n"
                    f"    {run.where()}\n    {run.cpu.summary(run.rows)}",
                    flush=True,
                )
                if sink == "delta" and shape == shape_list[0]:  # (not delta@amqp1.0: one ceiling a pair will do)
                    ceiling = rate_to_delta(spark, args.messages, batch, workdir)
                    steady.setdefault("rate", []).append(ceiling.steady)
                    print(
                        f"rate-micro-batch -> delta ({batch} rows a batch, no connector): steady {ceiling.steady:7,.0f} rows/s; "
                        f"source -> delta = {run.steady / ceiling.steady:.2f}x of it\n    {ceiling.where()}",
                        flush=True,
                    )
            if len(shape_list) > 1:
                report_shapes(shaped, bases, args.messages)
            for name in [s for s in steady if s.endswith("@amqp1.0") and s.split("@")[0] in steady]:
                over_10, over_091 = statistics.median(steady[name]), statistics.median(steady[name.split("@")[0]])
                print(
                    f"source over AMQP 1.0 -> {name.split('@')[0]}: {over_10:7,.0f} msg/s steady = {over_10 / over_091:.2f}x over AMQP 0-9-1 ({over_091:,.0f}; medians)"
                )
            if "noop" in steady and "delta" in steady:
                noop, delta = statistics.median(steady["noop"]), statistics.median(steady["delta"])
                print(f"source -> delta: {delta:7,.0f} msg/s steady = {delta / noop:.2f}x source -> noop ({noop:,.0f}; medians)")
            if "rate" in steady:
                delta, rate = statistics.median(steady["delta"]), statistics.median(steady["rate"])
                print(
                    f"source -> delta: {delta:7,.0f} msg/s steady = {delta / rate:.2f}x rate-micro-batch -> delta ({rate:,.0f} rows/s; "
                    "medians): Delta's own ceiling at this batch size"
                )
            if args.journal_pairs:
                off, on = statistics.median(rates["delta"]), statistics.median(rates["delta+journal"])
                print(
                    f"journal: delta {off:7,.0f} msg/s without, {on:7,.0f} msg/s with (medians of all batches, "
                    f"{args.journal_pairs} pairs) = {on / off:.2f}x, a cost of {100 * (1 - on / off):.1f}% (goal: at most 20%)"
                )
            if args.backlog:
                preload(url, queue, args.backlog)
                with RssSampler() as rss:
                    run = stream_once(spark, url, queue, "noop", options, workdir)
                assert run.rows == args.backlog, f"backlog: read {run.rows} of {args.backlog}"
                samples = [r for _, r in rss.samples]
                third = max(1, len(samples) // 3)
                print(
                    f"backlog {args.backlog}: {run.all_rate:,.0f} msg/s; runner RSS first third max {max(samples[:third]) / 2**20:.0f} MiB, "
                    f"last third max {max(samples[-third:]) / 2**20:.0f} MiB, peak {rss.peak / 2**20:.0f} MiB "
                    f"(payload {args.backlog * len(BODY) / 2**20:.0f} MiB)"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
