"""Stream mode throughput (issue 10) against raw pika and RabbitMQ's PerfTest on the same stream, in the same run.

    make perftest   # PerfTest's jars into .cache/perftest (Maven), once
    AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5672/%2F .venv/bin/python benchmarks/stream_throughput.py
    # and over the stream protocol too (issue 18; `make streamclient` first):
    AMQP_TEST_URL=... .venv/bin/python benchmarks/stream_throughput.py --stream-url rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F
    # a quick version while developing:
    AMQP_TEST_URL=... .venv/bin/python benchmarks/stream_throughput.py --messages 100000 --delta-messages 50000

Needs a RabbitMQ with stream queues (3.9+) in AMQP_TEST_URL: the embedded broker
has no stream queues yet, so without it the script stops at once.

It declares a stream, preloads ``--messages`` x 200-byte messages (PerfTest as
the producer, or pika's async publisher with ``--no-perftest``), then reads all
of them from the first offset with:

1. a raw pika stream consumer (SelectConnection, ``basic_qos(prefetch)``,
   ``x-stream-offset=first``, a multi-ack every prefetch/16 (``ACK_SHARE``) to give credit back,
   as the source's executor readers do);
2. PerfTest consuming the same stream over AMQP 0-9-1 (one consumer, same qos
   and multi-ack, consumer argument ``x-stream-offset=first``);
3. the source (``option("stream")``) into Spark's ``noop`` sink with
   Trigger.AvailableNow, for each ``--partitions`` value. Its rate is the rows over
   the batches' processing time (from the query's progress reports), and again
   including query start-up; both baselines are measured before and after the
   Spark runs and the ratios use their means.

Each measured run also reports the CPU used meanwhile, in cores, per process
group (the measured RabbitMQ node's beam.smp, other nodes apart; Spark's Python
workers, Spark's JVM, ...) from /proc, and the load average: the machine is
shared, so read the figures with it. The CPU per message of the run's own
processes (reader + broker + Spark) gives the rate CPU alone would allow if they
had every core: when the measured rate is near what the other jobs leave of
that, CPU is the limit, not the broker.

With ``--stream-url`` (or AMQP_TEST_STREAM_URL), the same broker's rabbitmq-stream:// uri,
the source also reads the same stream over RabbitMQ's stream protocol for each
``--partitions`` value (right after the AMQP 0-9-1 run with the same numPartitions),
against stream-protocol baselines measured before and after the Spark runs:
RabbitMQ's Java stream client (benchmarks/java/StreamConsume.java, ``make streamclient``;
one consumer, and as many consumers on their own connections as each numPartitions value,
after a warm-up read in the same JVM), rstream (raw, and AMQP 1.0 decoded) and
spark-amqp's own StreamClient (to records, and on to the source's Arrow rows; both from
benchmarks/stream_protocol_client.py).

With ``--shape both`` (or ``body-only``, ``producer``) and ``--stream-url`` it runs only this: each shape of
benchmarks/shapes.py in a stream of its own, both written by the connector's stream publisher (producer-like
messages with AMQP 1.0 properties and application properties), read over the stream protocol by the Java
stream client (before and after the Spark runs) and by the source -> noop for each ``--partitions`` value and
each protocol of ``--shape-over`` (the stream protocol, AMQP 0-9-1, AMQP 1.0); per partition count, the ratio
against the Java client with as many consumers (over the stream protocol), the CPU per message of each process
group, and producer-like / body-only.

Last (unless ``--skip-delta``), source -> Delta with a processing-time trigger
while a publisher adds ``--delta-messages`` at ``--delta-rate`` msg/s, without
and with ``minMessagesPerTrigger``: batches, rows per batch, and end-to-end msg/s
(from the publisher's start to the Delta commit holding the last message).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import pika
import pika_baseline as pb
import shapes
import stream_protocol_client as spc
import stream_reads
from machine import BROKER_PIDS, PERFTEST_DIR, REPO, STREAM_CLIENT_MAIN, CpuMeter, listening_pid, perftest
from spark_runs import BatchLog, run_to_end, spark_session

from spark_amqp.streams.range_reader import ACK_SHARE

BODY = b"x" * 200
STREAM_CLIENT_DIR = REPO / ".cache" / "stream-client"
JAVA_WARMUP = 100_000  # messages the Java stream client reads before its measured read, in the same JVM
WARMUP_MESSAGES = 20_000


# -- the broker and the baselines -------------------------------------------------------


def declare_stream(url: str, stream: str) -> None:
    pb.declare(url, stream, durable=True, arguments={"x-queue-type": "stream"})


def delete_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(queue)
    conn.close()


def perftest_publish_args(stream: str, count: int, rate: int | None = None) -> list[str]:
    # Predeclared stream (PerfTest also binds it to exchange "direct" with a key of its own), one producer,
    # 200-byte bodies, 2000 unconfirmed at most.
    args = ["--predeclared", "--queue", stream, "--producers", "1", "--consumers", "0"]
    args += ["--pmessages", str(count), "--size", str(len(BODY)), "--confirm", "2000"]
    if rate is not None:
        args += ["--rate", str(rate)]
    return args


def preload(url: str, stream: str, count: int, jars: Path | None) -> float:
    """Seconds to publish ``count`` messages into ``stream`` with publisher confirms."""
    start = time.perf_counter()
    if jars is not None:
        perftest(jars, url, *perftest_publish_args(stream, count))
    else:
        pb.publish_async(url, stream, count, BODY, window=2000)
    return time.perf_counter() - start


def perftest_consume(jars: Path, url: str, stream: str, count: int, prefetch: int, ack_every: int) -> float:
    """PerfTest's average consume rate (msg/s) reading ``count`` messages of the stream from its first offset."""
    out = perftest(
        jars,
        url,
        "--predeclared",
        "--queue",
        stream,
        "--producers",
        "0",
        "--consumers",
        "1",
        "--qos",
        str(prefetch),
        "--multi-ack-every",
        str(ack_every),
        "--consumer-args",
        "x-stream-offset=first",
        "--cmessages",
        str(count),
        "--time",
        "600",
    )
    if "Consumer reached message limit" not in out:
        raise RuntimeError(f"PerfTest did not read {count} messages:\n{out[-2000:]}")
    found = re.search(r"receiving rate avg: (\d+) msg/s", out)
    if not found:
        raise RuntimeError(f"no consume rate in PerfTest's output:\n{out[-2000:]}")
    return float(found.group(1))


def java_stream_consume(jars: Path, stream_url: str, stream: str, count: int, readers: int) -> tuple[float, CpuMeter]:
    """The Java stream client's rate (msg/s) reading the first ``count`` messages with ``readers`` consumers,
    and the CPU of its measured read alone (after JVM start-up and its warm-up read)."""
    warmup = min(count, JAVA_WARMUP)
    cmd = ["java", "-Dwait=true", "-cp", f"{jars}/*:{jars}/classes", STREAM_CLIENT_MAIN, stream_url, stream, str(count), str(readers)]
    cmd.append(str(warmup))
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        ready = proc.stdout.readline()
        line = ""
        if ready.strip() == "ready":
            with CpuMeter() as cpu:
                proc.stdin.write("go\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
        out, err = proc.communicate(timeout=120)
    found = re.match(r"rate (\d+) msg/s", line)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"StreamConsume failed ({proc.returncode}): {' '.join(cmd)}\n{ready}{line}{out[-2000:]}\n{err[-2000:]}")
    return float(found.group(1)), cpu


def protocol_baselines(jars: Path | None, stream_url: str, stream: str, count: int, readers: list[int], when: str) -> dict[str, float]:
    """The stream-protocol readers of the whole stream from ``first``, each printed with its CPU: msg/s by name."""
    import asyncio

    rates: dict[str, float] = {}

    def show(name: str, rate: float, cpu: CpuMeter) -> None:
        rates[name] = rate
        print(f"{name} ({when}): {rate:,.0f} msg/s\n    {cpu.summary(count)}", flush=True)

    if jars is not None:
        for k in readers:
            rate, cpu = java_stream_consume(jars, stream_url, stream, count, k)
            show(java_name(k), rate, cpu)
    options, login = spc.connection(stream_url), spc.rstream_login(stream_url)
    python_readers: list[tuple[str, Callable[[], Any]]] = [
        ("StreamClient to records", lambda: spc.ours_read(options, count, rows=False, stream=stream)),
        ("StreamClient to Arrow rows", lambda: spc.ours_read(options, count, rows=True, stream=stream)),
        ("rstream raw", lambda: spc.rstream_read(*login, count, decode=False, stream=stream)),
        ("rstream AMQP 1.0 decoded", lambda: spc.rstream_read(*login, count, decode=True, stream=stream)),
    ]
    for name, read in python_readers:
        with CpuMeter() as cpu:
            rate = asyncio.run(read())
        show(name, rate, cpu)
    return rates


def java_name(readers: int) -> str:
    return "Java stream client (1 consumer)" if readers == 1 else f"Java stream client ({readers} consumers)"


# -- Spark ------------------------------------------------------------------------------


def stream_reader(spark, url: str, stream: str, prefetch: int, **options: object):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("amqp").option("uri", url).option("stream", stream).option("prefetch", str(prefetch))
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value))
    return reader.load()


def available_now(  # type: ignore[no-untyped-def]
    spark, url: str, stream: str, partitions: int, args: argparse.Namespace, workdir: str, protocol: str | None = None
) -> tuple[BatchLog, float]:
    """One Trigger.AvailableNow run into noop: (its batches, wall seconds including query start-up)."""
    run = f"noop-{partitions}-{time.monotonic_ns()}"
    df = stream_reader(
        spark, url, stream, args.prefetch, numPartitions=partitions, maxMessagesPerTrigger=args.max_per_trigger or None, protocol=protocol
    )
    writer = df.writeStream.format("noop").option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}")).trigger(availableNow=True)
    return run_to_end(spark, writer)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.25)  # each check of a Delta run reads the progress reports over py4j


def delta_run(spark, url: str, stream: str, args: argparse.Namespace, workdir: str, jars: Path | None, minimum: int | None) -> str:  # type: ignore[no-untyped-def]
    """Source -> Delta with a processing-time trigger while a publisher adds messages at a steady rate."""
    declare_stream(url, stream)
    run = f"delta-{minimum}-{time.monotonic_ns()}"
    path = os.path.join(workdir, f"out-{run}")
    options: dict[str, object] = {"maxMessagesPerTrigger": args.max_per_trigger or None}
    if minimum is not None:
        options |= {"minMessagesPerTrigger": minimum, "maxTriggerDelay": args.max_trigger_delay}
    df = stream_reader(spark, url, stream, args.prefetch, **options)
    query = (
        df.writeStream.format("delta")
        .option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}"))
        .trigger(processingTime=args.delta_trigger)
        .start(path)
    )
    log = BatchLog(query)
    count, rate = args.delta_messages, args.delta_rate
    try:
        # Query start-up is not part of the figure: publish once the query polls the stream.
        wait_for(lambda: "Waiting" in query.status["message"] or query.exception() is not None, 120, "query start")
        with CpuMeter() as cpu:
            start = time.time()  # epoch seconds, as the batches' ends
            published: list[float] = []
            publisher = threading.Thread(target=lambda: published.append(steady_publish(url, stream, count, rate, jars)), daemon=True)
            publisher.start()
            wait_for(lambda: log.rows >= count or query.exception() is not None, 5 * count / rate + 300, "Delta run")
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            end = log.batches[-1][2]
            publisher.join()
        publish_end = start + published[0]
    finally:
        query.stop()
    written = spark.read.format("delta").load(path).count()
    assert log.rows == count and written == count, f"Delta run: {log.rows} rows in batches, {written} in the table, of {count}"
    sizes = [b[0] for b in log.batches]
    label = (
        "without minMessagesPerTrigger" if minimum is None else f"minMessagesPerTrigger={minimum}, maxTriggerDelay={args.max_trigger_delay}"
    )
    return (
        f"source -> delta, trigger {args.delta_trigger}, {label}: {len(sizes)} batches, {statistics.mean(sizes):,.0f} rows/batch "
        f"(min {min(sizes):,}, max {max(sizes):,}), {statistics.mean(b[1] for b in log.batches):.2f} s/batch; "
        f"end-to-end {count / (end - start):,.0f} msg/s ({end - start:.1f} s; publisher {published[0]:.1f} s at {rate:,} msg/s, "
        f"last commit {end - publish_end:.1f} s after it)\n    {cpu.summary()}"
    )


def steady_publish(url: str, stream: str, count: int, rate: int, jars: Path | None) -> float:
    """Seconds to publish ``count`` messages at ``rate`` msg/s (PerfTest's rate limit, or pika in bursts of 1/20 s)."""
    start = time.monotonic()
    if jars is not None:
        perftest(jars, url, *perftest_publish_args(stream, count, rate))
    else:
        burst = max(1, rate // 20)
        for i in range(0, count, burst):
            pb.publish_async(url, stream, min(burst, count - i), BODY, window=2000)
            time.sleep(max(0.0, start + (i + burst) / rate - time.monotonic()))
    return time.monotonic() - start


def batch_reads(spark, url: str, stream: str, filtered: str, args: argparse.Namespace, raw: float, partitions: list[int]) -> None:  # type: ignore[no-untyped-def]
    """spark.read of the whole stream, and of a stream of the same size filtered to 1 in 10, against raw pika."""
    n = args.messages
    ack_every = max(1, args.prefetch // ACK_SHARE)
    for p in partitions:
        with CpuMeter() as cpu:
            seconds = stream_reads.spark_batch_read(spark, url, stream, p, n)
        print(
            f"spark.read numPartitions={p} of {n:,} messages (count()): {n / seconds:,.0f} msg/s = {n / seconds / raw:.2f}x raw pika "
            f"({seconds:.1f} s, planning and job start included)\n    {cpu.summary(n)}",
            flush=True,
        )
    declare_stream(url, filtered)
    wanted = stream_reads.matching(n)
    seconds = stream_reads.preload_filtered(url, filtered, n)
    print(
        f"{n:,} messages with x-stream-filter-value v0..v9 in blocks of {stream_reads.FILTER_BLOCK:,} in '{filtered}' "
        f"({n / seconds:,.0f} msg/s); filter=v0 keeps {wanted:,}",
        flush=True,
    )
    base = [stream_reads.raw_filtered(url, filtered, n, args.prefetch, ack_every)]
    runs = []
    for p in partitions:
        with CpuMeter() as cpu:
            seconds = stream_reads.spark_batch_read(spark, url, filtered, p, wanted, filter="v0")
        runs.append((p, seconds, cpu))
    base.append(stream_reads.raw_filtered(url, filtered, n, args.prefetch, ack_every))
    raw_f = sum(base) / len(base)
    unfiltered = n / stream_reads.spark_batch_read(spark, url, filtered, max(partitions), n)
    print(
        f"raw pika with x-stream-filter=v0, checking each header (before, after): {base[0]:,.0f}, {base[1]:,.0f} offsets/s; "
        f"the same stream read unfiltered by spark.read numPartitions={max(partitions)}: {unfiltered:,.0f} msg/s",
        flush=True,
    )
    for p, seconds, cpu in runs:
        print(
            f"spark.read filter=v0 numPartitions={p}: {n / seconds:,.0f} offsets/s ({wanted:,} rows in {seconds:.1f} s) = "
            f"{n / seconds / raw_f:.2f}x raw pika filtered, {n / seconds / unfiltered:.2f}x the unfiltered read\n    {cpu.summary(n)}",
            flush=True,
        )


def report_protocol(
    results: list[tuple[int, BatchLog, float, CpuMeter]], amqp: dict[int, float], before: dict[str, float], after: dict[str, float]
) -> None:
    """The source over the stream protocol against its AMQP 0-9-1 runs and the stream-protocol baselines (their means)."""
    base = {name: (before[name] + after[name]) / 2 for name in before}
    print("stream-protocol baselines (means of before and after): " + ", ".join(f"{n} {r:,.0f} msg/s" for n, r in base.items()))
    one = None
    for p, log, wall, cpu in results:
        rate = log.rows / log.seconds
        one = one or rate
        versus = [f"{rate / amqp[p]:.2f}x the AMQP 0-9-1 source (numPartitions={p}, {amqp[p]:,.0f} msg/s)"]
        versus += [f"{rate / r:.2f}x {n}" for n, r in base.items() if not n.startswith("Java") or n in (java_name(1), java_name(p))]
        scaling = ""
        if p != results[0][0]:
            java = (
                f", the Java client's {p} consumers {base[java_name(p)] / base[java_name(1)]:.2f}x its 1"
                if java_name(p) in base and java_name(1) in base
                else ""
            )
            scaling = f"; scaling: {rate / one:.2f}x numPartitions={results[0][0]}{java}"
        print(
            f"source over the stream protocol numPartitions={p} -> noop: {rate:,.0f} msg/s = " + ", ".join(versus) + scaling + " "
            f"({len(log.batches)} batches, {log.seconds:.1f} s); incl. query start-up {log.rows / wall:,.0f} msg/s ({wall:.1f} s)"
            f"\n    {cpu.summary(log.rows)}",
            flush=True,
        )


# -- producer-like against body-only messages over the stream protocol (--shape) --------


def write_shape(stream_url: str, stream: str, shape: str, count: int) -> float:
    """msg/s writing ``count`` messages of ``shape`` (shapes.py) into ``stream`` with the connector's stream
    publisher (no Spark): AMQP 1.0 properties and application properties for the producer-like ones."""
    import asyncio
    import uuid

    from spark_amqp.sink.options import parse_sink_options
    from spark_amqp.sink.producers import producer_for
    from spark_amqp.sink.stream_publisher import StreamPartitionPublisher

    opts = parse_sink_options({"uri": stream_url, "stream": stream})
    batches = list(shapes.arrow_batches(shape, count))
    start = time.perf_counter()
    done = asyncio.run(StreamPartitionPublisher(opts, producer_for(f"bench-{uuid.uuid4().hex}", 0, 0)).publish(batches))
    elapsed = time.perf_counter() - start
    assert done.confirmed == count, done
    return count / elapsed


# How --shape-over reads the shapes' streams: the uri (the stream protocol's, or the AMQP one) and option protocol.
OVER = {"stream": ("stream", None), "amqp0-9-1": ("amqp", None), "amqp1.0": ("amqp", "amqp1.0")}


def shapes_run(url: str, stream_url: str, java: Path | None, args: argparse.Namespace, partitions: list[int], cores: int) -> None:
    """Each shape in a stream of its own, both written by the connector's stream publisher (so that their chunks
    are alike); read over the stream protocol by the Java stream client (before and after the Spark runs) and by
    the source -> noop for each numPartitions and each protocol of --shape-over, shapes in alternating order; per
    partition count and protocol, ratios of the shapes, against the Java client over the stream protocol, and CPU
    us/msg per process group."""
    from source_throughput import cpu_text, median_cpu

    shape_list = list(shapes.SHAPES) if args.shape == "both" else [args.shape]
    overs = [o for o in args.shape_over.split(",") if o]
    n = args.messages
    streams = {shape: f"bench.stream.{os.getpid()}.{shape}" for shape in shape_list}
    warm = f"bench.stream.{os.getpid()}.warmup"
    workdir = tempfile.mkdtemp(prefix="amqp-stream-bench-")
    spark = None
    java_rates: dict[tuple[str, int], list[float]] = {}
    java_cpu: dict[tuple[str, int], list[dict[str, float]]] = {}

    def java_baselines(when: str) -> None:
        if java is None or "stream" not in overs:
            return
        for shape in shape_list:
            for k in partitions:
                rate, cpu = java_stream_consume(java, stream_url, streams[shape], n, k)
                java_rates.setdefault((shape, k), []).append(rate)
                java_cpu.setdefault((shape, k), []).append(cpu.per_message(n))
                print(f"{java_name(k)}, {shape} messages ({when}): {rate:,.0f} msg/s\n    {cpu.summary(n)}", flush=True)

    def read(over: str, stream: str, p: int) -> tuple[BatchLog, float]:
        uri, protocol = OVER[over]
        return available_now(spark, stream_url if uri == "stream" else url, stream, p, args, workdir, protocol)

    try:
        for shape in shape_list:
            declare_stream(url, streams[shape])
            rate = write_shape(stream_url, streams[shape], shape, n)
            print(
                f"{n:,} {shape} messages ({shapes.mean_body_size(shape):.0f} B bodies) in stream '{streams[shape]}', "
                f"written by the connector's stream publisher at {rate:,.0f} msg/s",
                flush=True,
            )
        with open("/proc/loadavg") as f:
            print(f"load average {' '.join(f.read().split()[:3])}; Spark local[{cores}] on {os.cpu_count()} CPUs; prefetch {args.prefetch}")
        java_baselines("before")
        spark = spark_session("spark-amqp stream benchmark", f"local[{cores}]")
        declare_stream(url, warm)
        write_shape(stream_url, warm, "producer", WARMUP_MESSAGES)
        for over in overs:  # JVM, Python workers and each protocol's modules warm up; not measured
            read(over, warm, max(partitions))
        runs: dict[tuple[str, str, int], tuple[BatchLog, float, CpuMeter]] = {}
        for over in overs:
            for j, p in enumerate(partitions):
                for shape in shape_list if j % 2 == 0 else shape_list[::-1]:
                    with CpuMeter() as cpu:
                        log, wall = read(over, streams[shape], p)
                    assert log.rows == n, f"{shape} over {over}, numPartitions={p}: read {log.rows} of {n}"
                    runs[(over, shape, p)] = (log, wall, cpu)
                    print(
                        f"(source over {over}, {shape} messages, numPartitions={p}: {log.rows / log.seconds:,.0f} msg/s)",
                        flush=True,
                    )
        java_baselines("after")
        print("\nproducer-like against body-only messages (the Java client, over the stream protocol: mean of before and after):")
        for over in overs:
            rates: dict[tuple[str, int], float] = {}
            for p in partitions:
                for shape in shape_list:
                    log, wall, cpu = runs[(over, shape, p)]
                    rate = rates[(shape, p)] = log.rows / log.seconds
                    line = f"  over {over}, numPartitions={p}, {shape:9s}: source {rate:9,.0f} msg/s ({len(log.batches)} batches, {log.seconds:.1f} s)"
                    if over == "stream" and (shape, p) in java_rates:
                        jr = statistics.mean(java_rates[(shape, p)])
                        line += f" = {rate / jr:.2f}x {java_name(p)} {jr:,.0f} msg/s"
                    print(f"{line}\n    source's CPU us/msg: {cpu_text(cpu.per_message(log.rows))}")
                    if over == "stream" and (shape, p) in java_cpu:
                        print(f"    Java client's CPU us/msg (median): {cpu_text(median_cpu(java_cpu[(shape, p)]))}")
                if len(shape_list) == 2:
                    java_ratio = ""
                    if over == "stream" and ("producer", p) in java_rates and ("body-only", p) in java_rates:
                        java_ratio = f"; the Java client {statistics.mean(java_rates[('producer', p)]) / statistics.mean(java_rates[('body-only', p)]):.2f}x"
                    print(
                        f"  over {over}, numPartitions={p}, producer-like / body-only: the source "
                        f"{rates[('producer', p)] / rates[('body-only', p)]:.2f}x{java_ratio}"
                    )
        print(
            f"mode: {'pure Python (SPARK_AMQP_PURE_PYTHON)' if os.environ.get('SPARK_AMQP_PURE_PYTHON') == '1' else 'compiled core (default)'}"
        )
    finally:
        for name in (*streams.values(), warm):
            try:
                delete_queue(url, name)
            except Exception as err:
                print(f"could not delete {name}: {err}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        if spark is not None:
            spark.stop()


# -- the run ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", default="1,2,4", help="numPartitions values, comma-separated")
    parser.add_argument(
        "--cores", type=int, default=0, help="Spark's local[N] (default: the largest numPartitions, so all tasks run at once)"
    )
    parser.add_argument("--prefetch", type=int, default=2000, help="per-consumer credit of every reader (the source's default is 2000)")
    parser.add_argument("--max-per-trigger", type=int, default=250_000, help="maxMessagesPerTrigger (0: none, one batch per run)")
    parser.add_argument("--no-perftest", action="store_true", help="no PerfTest baseline; preload with pika")
    parser.add_argument("--perftest-jars", type=Path, default=PERFTEST_DIR)
    parser.add_argument(
        "--stream-url",
        default=os.environ.get("AMQP_TEST_STREAM_URL"),
        help="the same broker's rabbitmq-stream:// uri (default: AMQP_TEST_STREAM_URL): the source also reads over the stream protocol",
    )
    parser.add_argument("--no-stream-client", action="store_true", help="no Java stream client baseline (with --stream-url)")
    parser.add_argument("--stream-client-jars", type=Path, default=STREAM_CLIENT_DIR)
    parser.add_argument("--skip-delta", action="store_true")
    parser.add_argument("--delta-messages", type=int, default=200_000)
    parser.add_argument("--delta-rate", type=int, default=5_000, help="msg/s the publisher adds during the Delta runs")
    parser.add_argument("--delta-trigger", default="100 milliseconds", help="processing-time trigger of the Delta runs")
    parser.add_argument("--delta-min", type=int, default=50_000, help="minMessagesPerTrigger of the second Delta run")
    parser.add_argument("--max-trigger-delay", default="10s")
    parser.add_argument("--skip-batch", action="store_true", help="no spark.read runs (whole and filtered)")
    parser.add_argument("--only-batch", action="store_true", help="only the spark.read runs and the raw pika baselines")
    parser.add_argument(
        "--shape",
        choices=("body-only", "producer", "both"),
        default=None,
        help="only the stream-protocol reads of messages of this shape (benchmarks/shapes.py; both: side by side), "
        "written by the connector's stream publisher, against the Java stream client (needs --stream-url)",
    )
    parser.add_argument(
        "--shape-over",
        default="stream",
        help="with --shape: the protocols the source reads the shapes' streams over, comma-separated, of stream, amqp0-9-1, "
        "amqp1.0 (RabbitMQ 4.x)",
    )
    args = parser.parse_args()
    if args.only_batch:
        args.skip_delta, args.no_perftest = True, True

    url = os.environ.get("AMQP_TEST_URL")
    if not url:
        sys.exit(
            "stream_throughput.py needs RabbitMQ (3.9+, stream queues): set AMQP_TEST_URL, e.g. "
            "AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5672/%2F (it measures RabbitMQ against PerfTest, not the embedded broker)."
        )
    jars: Path | None = None
    if not args.no_perftest:
        jars = args.perftest_jars.resolve()
        if not any(jars.glob("perf-test-*.jar")):
            sys.exit(f"PerfTest's jars are not in {jars}: run `make perftest` (Maven), or pass --no-perftest")
    stream_url: str | None = None if args.only_batch else args.stream_url or None
    java: Path | None = None
    if stream_url and not args.no_stream_client:
        java = args.stream_client_jars.resolve()
        if not (java / "classes" / f"{STREAM_CLIENT_MAIN}.class").exists():
            sys.exit(f"the Java stream client is not in {java}: run `make streamclient` (Maven, javac), or pass --no-stream-client")
    partitions = [int(p) for p in args.partitions.split(",") if p]
    cores = args.cores or max(partitions)
    if args.shape:
        if not stream_url:
            sys.exit("--shape reads over the stream protocol: give --stream-url (or AMQP_TEST_STREAM_URL)")
        node = listening_pid(urllib.parse.urlsplit(url).port or 5672)
        if node is not None:
            BROKER_PIDS.add(node)
        shapes_run(url, stream_url, java, args, partitions, cores)
        return
    ack_every = max(1, args.prefetch // ACK_SHARE)  # the baselines give credit back as the source does
    node = listening_pid(urllib.parse.urlsplit(url).port or 5672)
    if node is not None:
        BROKER_PIDS.add(node)
    stream = f"bench.stream.{os.getpid()}"
    warm = f"{stream}.warmup"
    delta_streams = [f"{stream}.delta.{i}" for i in range(2)]
    filtered = f"{stream}.filtered"
    workdir = tempfile.mkdtemp(prefix="amqp-stream-bench-")
    spark = None
    try:
        declare_stream(url, stream)
        seconds = preload(url, stream, args.messages, jars)
        producer = "PerfTest" if jars else "pika async"
        print(
            f"{args.messages:,} x {len(BODY)} B in stream '{stream}' on RabbitMQ ({producer}, confirms: {args.messages / seconds:,.0f} msg/s); "
            f"prefetch {args.prefetch}, ack every {ack_every}; Spark local[{cores}] on {os.cpu_count()} CPUs; "
            f"maxMessagesPerTrigger={args.max_per_trigger or 'none'}; the node's beam.smp: pid {node or 'not found (every beam.smp counts)'}",
            flush=True,
        )

        def baselines(when: str) -> tuple[float, float | None]:
            with CpuMeter() as cpu:
                raw = args.messages / pb.consume(url, stream, args.messages, args.prefetch, ack_every, {"x-stream-offset": "first"})
            print(f"raw pika stream consumer ({when}): {raw:,.0f} msg/s\n    {cpu.summary(args.messages)}", flush=True)
            if jars is None:
                return raw, None
            with CpuMeter() as cpu:
                perf = perftest_consume(jars, url, stream, args.messages, args.prefetch, ack_every)
            print(f"PerfTest stream consumer ({when}): {perf:,.0f} msg/s\n    {cpu.summary(args.messages)}", flush=True)
            return raw, perf

        before = baselines("before the Spark runs")
        protocol_before = protocol_baselines(java, stream_url, stream, args.messages, partitions, "before") if stream_url else {}

        spark = spark_session("spark-amqp stream benchmark", f"local[{cores}]")
        declare_stream(url, warm)
        preload(url, warm, WARMUP_MESSAGES, jars)
        available_now(spark, url, warm, max(partitions), args, workdir)  # JVM and Python workers warm up; not measured
        if stream_url:
            available_now(spark, stream_url, warm, max(partitions), args, workdir)
        results = []
        protocol_results = []
        for p in [] if args.only_batch else partitions:
            with CpuMeter() as cpu:
                log, wall = available_now(spark, url, stream, p, args, workdir)
            assert log.rows == args.messages, f"numPartitions={p}: read {log.rows} of {args.messages}"
            results.append((p, log, wall, cpu))
            print(f"(source numPartitions={p} -> noop: {log.rows / log.seconds:,.0f} msg/s; ratios below)", flush=True)
            if stream_url:
                with CpuMeter() as cpu:
                    log, wall = available_now(spark, stream_url, stream, p, args, workdir)
                assert log.rows == args.messages, f"stream protocol, numPartitions={p}: read {log.rows} of {args.messages}"
                protocol_results.append((p, log, wall, cpu))
                print(f"(source over the stream protocol, numPartitions={p} -> noop: {log.rows / log.seconds:,.0f} msg/s)", flush=True)

        after = baselines("after the Spark runs")
        protocol_after = protocol_baselines(java, stream_url, stream, args.messages, partitions, "after") if stream_url else {}
        raw = (before[0] + after[0]) / 2
        perf = (before[1] + after[1]) / 2 if before[1] is not None and after[1] is not None else None
        versus = f" and PerfTest {perf:,.0f} msg/s" if perf else ""
        print(f"baselines (means of before and after): raw pika {raw:,.0f} msg/s{versus}")
        for p, log, wall, cpu in results:
            rate = log.rows / log.seconds
            vs_perf = f", {rate / perf:.2f}x PerfTest" if perf else ""
            steady = ""
            if len(log.batches) > 1:
                later = log.batches[1:]
                steady_rate = sum(b[0] for b in later) / sum(b[1] for b in later)
                steady = f"; after the first batch {steady_rate:,.0f} msg/s"
            print(
                f"source numPartitions={p} -> noop: {rate:,.0f} msg/s = {rate / raw:.2f}x raw pika{vs_perf} "
                f"({len(log.batches)} batches, {log.seconds:.1f} s){steady}; incl. query start-up {log.rows / wall:,.0f} msg/s "
                f"({wall:.1f} s) = {log.rows / wall / raw:.2f}x raw pika\n    {cpu.summary(log.rows)}",
                flush=True,
            )
        if stream_url:
            amqp_rates = {p: log.rows / log.seconds for p, log, _, _ in results}
            report_protocol(protocol_results, amqp_rates, protocol_before, protocol_after)

        if not args.skip_batch:
            batch_reads(spark, url, stream, filtered, args, raw, partitions)

        if not args.skip_delta:
            declare_stream(url, warm)
            preload(url, warm, WARMUP_MESSAGES, jars)
            warmup = spark.readStream.format("amqp").option("uri", url).option("stream", warm).load()
            q = warmup.writeStream.format("delta").option("checkpointLocation", os.path.join(workdir, "ckpt-delta-warmup"))
            q.trigger(availableNow=True).start(os.path.join(workdir, "out-delta-warmup")).awaitTermination()
            for name, minimum in zip(delta_streams, (None, args.delta_min), strict=True):
                print(delta_run(spark, url, name, args, workdir, jars, minimum), flush=True)
    finally:
        for name in (stream, warm, *delta_streams, filtered):
            try:
                delete_queue(url, name)
            except Exception as err:
                print(f"could not delete {name}: {err}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    main()
