"""Source throughput against a raw pika consumer draining the same load, in the same run.

    AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5672/%2F python benchmarks/source_throughput.py

For each sink (noop, parquet, delta, delta with the batch journal) it preloads
``--messages`` x 200-byte messages,
streams them with Trigger.AvailableNow, and divides by the time from the first
batch's start to the last batch's end (query start-up, 5-9 s on 2 cores, is
reported apart). The baseline is pika's SelectConnection consumer with prefetch
1000 and a multi-ack every 1000 on the same queue contents, run before the first
sink and again after every sink: each sink is compared with the mean of the
baseline runs around it (the machine's pace drifts). Then it streams a
``--backlog`` queue and samples the source runner's resident memory, which
must stay flat (bounded by the prefetch, not the backlog). The two Delta runs
run ``--repeat`` times in ABBA order; the journal's cost is the ratio of their medians.

Without AMQP_TEST_URL it runs against the embedded broker in its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import pika_baseline as pb
from spark_runs import run_to_end, spark_session

BODY = b"x" * 200
RUNNER = "python_streaming_source_runner"


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


def stream_once(spark, url: str, queue: str, sink: str, max_per_trigger: int, workdir: str) -> tuple[float, float, int, float]:  # type: ignore[no-untyped-def]
    """(processing seconds, wall seconds, rows, steady-state msg/s) for one AvailableNow run.

    Steady state leaves out the first batch, which also pays for the query's first
    Python worker (imports, about 2 s on 2 cores) and holds whatever arrived first.
    """
    run = f"{sink}-{time.monotonic_ns()}"
    reader = (
        spark.readStream.format("amqp")
        .option("uri", url)
        .option("queue", queue)
        .option("maxMessagesPerTrigger", str(max_per_trigger))
        .option("prefetch", str(min(65535, 2 * max_per_trigger)))
    )
    if sink.endswith("+journal"):
        reader = reader.option("journalLocation", os.path.join(workdir, f"journal-{run}"))
    writer = reader.load().writeStream.option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}")).trigger(availableNow=True)
    if sink == "noop":
        writer = writer.format("noop")
    else:
        writer = writer.format(sink.split("+")[0]).option("path", os.path.join(workdir, f"out-{run}"))
    log, wall = run_to_end(spark, writer)
    later = log.batches[1:]
    steady = sum(b[0] for b in later) / sum(b[1] for b in later) if later else log.rows / log.seconds
    return log.seconds, wall, log.rows, steady


def preload(url: str, queue: str, count: int) -> None:
    pb.declare(url, queue)
    pb.publish_async(url, queue, count, BODY, window=2000)


@contextlib.contextmanager
def broker_url() -> Iterator[tuple[str, str]]:
    real = os.environ.get("AMQP_TEST_URL")
    if real:
        yield real, "RabbitMQ"
    else:
        with pb.embedded_broker_process() as (url, _):
            yield url, "embedded broker"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--max-per-trigger", type=int, default=32_000)
    parser.add_argument("--backlog", type=int, default=1_000_000, help="messages for the memory check (0 to skip)")
    parser.add_argument("--sinks", default="noop,parquet")
    parser.add_argument("--repeat", type=int, default=4, help="pairs of delta runs without and with the journal")
    args = parser.parse_args()
    spark = spark_session("spark-amqp source benchmark")
    workdir = tempfile.mkdtemp(prefix="amqp-bench-")
    queue = "bench.source"
    try:
        with broker_url() as (url, label):
            print(f"{args.messages} x {len(BODY)} B on {label}; maxMessagesPerTrigger={args.max_per_trigger}")
            preload(url, queue, args.messages)
            raw = args.messages / pb.consume(url, queue, args.messages, prefetch=1000, ack_every=1000)
            preload(url, queue, 20_000)  # warm up the JVM and Python workers; not measured
            stream_once(spark, url, queue, "noop", args.max_per_trigger, workdir)
            if args.repeat:  # Delta's first write in a JVM loads and compiles a lot
                preload(url, queue, 20_000)
                stream_once(spark, url, queue, "delta+journal", args.max_per_trigger, workdir)
            print(f"raw pika consumer (prefetch 1000, multi-ack/1000): {raw:9.0f} msg/s")

            def pika_again() -> float:
                preload(url, queue, args.messages)
                rate = args.messages / pb.consume(url, queue, args.messages, prefetch=1000, ack_every=1000)
                print(f"raw pika consumer again: {rate:9.0f} msg/s")
                return rate

            # ABBA order: Delta keeps getting faster as the JVM warms up, which would favour whichever runs second.
            pairs = [("delta", "delta+journal") if i % 2 == 0 else ("delta+journal", "delta") for i in range(args.repeat)]
            sinks = [s for s in args.sinks.split(",") if s] + [sink for pair in pairs for sink in pair]
            rates: dict[str, list[float]] = {}
            for sink in sinks:
                preload(url, queue, args.messages)
                with RssSampler() as rss:
                    processing, wall, rows, steady = stream_once(spark, url, queue, sink, args.max_per_trigger, workdir)
                assert rows == args.messages, f"{sink}: read {rows} of {args.messages}"
                rate = rows / processing
                rates.setdefault(sink, []).append(rate)
                after = pika_again()
                around, raw = (raw + after) / 2, after
                print(
                    f"source -> {sink:13s}: steady {steady:7.0f} msg/s = {steady / around:.2f}x raw pika (mean {around:.0f} of the runs "
                    f"around it); all batches {rate:7.0f} msg/s = {rate / around:.2f}x; incl. query start-up {rows / wall:7.0f} msg/s "
                    f"({wall:4.1f} s); runner peak RSS {rss.peak / 2**20:.0f} MiB",
                    flush=True,
                )
            if args.repeat:
                off, on = statistics.median(rates["delta"]), statistics.median(rates["delta+journal"])
                print(
                    f"journal: delta {off:7.0f} msg/s without, {on:7.0f} msg/s with (medians of {args.repeat}) "
                    f"= {on / off:.2f}x, a cost of {100 * (1 - on / off):.1f}% (goal: at most 20%)"
                )
            if args.backlog:
                preload(url, queue, args.backlog)
                with RssSampler() as rss:
                    processing, wall, rows, _ = stream_once(spark, url, queue, "noop", args.max_per_trigger, workdir)
                assert rows == args.backlog, f"backlog: read {rows} of {args.backlog}"
                samples = [r for _, r in rss.samples]
                third = max(1, len(samples) // 3)
                print(
                    f"backlog {args.backlog}: {rows / processing:.0f} msg/s; runner RSS first third max "
                    f"{max(samples[:third]) / 2**20:.0f} MiB, last third max {max(samples[-third:]) / 2**20:.0f} MiB, "
                    f"peak {rss.peak / 2**20:.0f} MiB (payload {args.backlog * len(BODY) / 2**20:.0f} MiB)"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
