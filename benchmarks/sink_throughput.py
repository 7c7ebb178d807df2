"""Sink throughput against raw pika publishers, and over the stream protocol against rstream, side by side in the same run.

    AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5672/%2F python benchmarks/sink_throughput.py \
        [--stream-url rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F]

``--amqp10-rounds N`` adds N pairs of 1-partition runs over AMQP 0-9-1 and over AMQP 1.0 (``protocol=amqp1.0``,
RabbitMQ 4.x), in ABBA order, and prints the ratio of their medians.

Writes ``--rows`` x 200-byte rows with ``df.write.format("amqp")`` from one and
from two partitions (the DataFrame is cached first, so only publishing is
timed), and compares with pika's SelectConnection keeping 1000 confirms
outstanding and with pika's BlockingConnection doing one synchronous confirm per
message (on ``--sync-rows`` messages, it is slow). Without AMQP_TEST_URL the
embedded broker runs in its own process.

With ``--stream-url`` (or AMQP_TEST_STREAM_URL), the same ``--rows`` also go over
RabbitMQ's stream protocol, in this order, ``--stream-rounds`` times (means reported):
rstream publishing with confirms (``stream_protocol_client.rstream_publish``), our
``StreamClient`` publishing with deduplication (``ours_publish``, the client's own
limit), then the sink with ``deduplication`` on from 1 and 2 partitions and with it
off from 1 partition. Each sink run writes to a fresh stream, and its rate counts
only if the stream then holds exactly the rows written (the stream's
``committed_offset`` + 1 from a stream-protocol ``stats`` call on RabbitMQ 4.3+, the last
committed chunk's next offset on 4.0; a passive queue.declare's message count is 0 for a
stream on 4.3, measured). rstream's rate counts its confirms (it deletes its stream).

``--shape-rounds N`` runs only N rounds of producer-like against body-only rows (benchmarks/shapes.py), each
from one partition: raw pika async publishing the same messages, PerfTest's producer with confirms (``make
perftest``; its own messages, of the shape's mean body size), the sink over AMQP 0-9-1 and over AMQP 1.0 (RabbitMQ
4.x) and (with ``--stream-url``) the stream sink with deduplication, with the CPU per message of each process group.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika_baseline as pb
import shapes
import stream_protocol_client as spc
from amqp_client import server_version
from machine import PERFTEST_DIR, CpuMeter, perftest
from source_throughput import broker_url, cpu_text, median_cpu
from spark_runs import spark_session

from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient

BODY = b"x" * 200
SINK_STREAM = "bench-sink-stream"


def sink_rate(spark, url: str, queue: str, rows: int, partitions: int, protocol: str = "amqp0-9-1") -> float:  # type: ignore[no-untyped-def]
    df = spark.range(rows).selectExpr("repeat('x', 200) as body").repartition(partitions).cache()
    df.count()
    pb.declare(url, queue)
    start = time.perf_counter()
    writer = df.write.format("amqp").option("uri", url).option("protocol", protocol).option("routingKey", queue)
    writer.option("maxInFlight", "1000").mode("append").save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return rows / elapsed


def amqp10_benchmarks(spark, url: str, queue: str, rows: int, rounds: int) -> None:  # type: ignore[no-untyped-def]
    """The sink from 1 partition over AMQP 1.0 against the same over AMQP 0-9-1, in ABBA order (the machine drifts)."""
    rates: dict[str, list[float]] = {"amqp0-9-1": [], "amqp1.0": []}
    for i in range(rounds):
        for protocol in ("amqp0-9-1", "amqp1.0") if i % 2 == 0 else ("amqp1.0", "amqp0-9-1"):
            rates[protocol].append(sink_rate(spark, url, queue, rows, 1, protocol))
            print(f"sink over {protocol:9s}, 1 partition: {rates[protocol][-1]:9.0f} msg/s", flush=True)
    pb.declare(url, queue)
    over_10, over_091 = statistics.median(rates["amqp1.0"]), statistics.median(rates["amqp0-9-1"])
    print(f"sink over AMQP 1.0: {over_10:9.0f} msg/s = {over_10 / over_091:.2f}x over AMQP 0-9-1 ({over_091:.0f}; medians of {rounds})")


# -- over the stream protocol ----------------------------------------------------------------------


async def _fresh_stream(options: Any, stream: str) -> None:
    client = await StreamClient.connect(options, "bench sink setup")
    try:
        try:
            await client.delete(stream)
        except Exception:  # absent: nothing to delete
            pass
        await client.create(stream)
    finally:
        await client.close()


async def _stream_count(options: Any, stream: str, expected: int) -> int:
    """Messages in ``stream`` (a fresh one), waited for up to 10 s to reach ``expected``: ``committed_offset`` + 1
    (RabbitMQ 4.3+), else the next offset after the last committed chunk, read from that chunk's header (4.0)."""
    client = await StreamClient.connect(options, "bench sink check")
    try:
        deadline = time.monotonic() + 10
        while True:
            stats = await client.stats(stream)
            if "committed_offset" in stats:
                count = stats["committed_offset"] + 1
            elif stats["committed_chunk_id"] < 0:
                count = 0
            else:
                count = await _chunk_end(client, stream, stats["committed_chunk_id"])
            if count >= expected or time.monotonic() > deadline:
                return count
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def _chunk_end(client: StreamClient, stream: str, chunk_id: int) -> int:
    """The offset after the chunk at ``chunk_id``: its first offset plus its records."""
    header: asyncio.Future[chunks.ChunkHeader] = asyncio.get_running_loop().create_future()

    def on_chunk(view: memoryview) -> None:
        if not header.done():
            header.set_result(chunks.read_header(view))

    await client.subscribe(1, stream, OffsetSpec.offset(chunk_id), 1, on_chunk)
    try:
        return (await asyncio.wait_for(header, 10)).next_offset
    finally:
        await client.unsubscribe(1)


async def _delete_stream(options: Any, stream: str) -> None:
    client = await StreamClient.connect(options, "bench sink cleanup")
    try:
        await client.delete(stream)
    finally:
        await client.close()


def checked(rate: float, options: Any, stream: str, rows: int, what: str) -> float:
    """``rate`` if ``stream`` holds exactly ``rows`` messages; fails the benchmark otherwise (and drops the stream)."""
    try:
        count = asyncio.run(_stream_count(options, stream, rows))
    finally:
        asyncio.run(_delete_stream(options, stream))
    if count != rows:
        raise RuntimeError(f"{what}: stream '{stream}' holds {count} messages, {rows} were written: no rate")
    return rate


def stream_sink_rate(  # type: ignore[no-untyped-def]
    spark, stream_url: str, rows: int, partitions: int, dedup: bool, max_in_flight: int
) -> float:
    options = spc.connection(stream_url)
    df = spark.range(rows).selectExpr("repeat('x', 200) as body").repartition(partitions).cache()
    df.count()
    asyncio.run(_fresh_stream(options, SINK_STREAM))
    start = time.perf_counter()
    (
        df.write.format("amqp")
        .option("uri", stream_url)
        .option("stream", SINK_STREAM)
        .option("deduplication", str(dedup).lower())
        .option("maxInFlight", str(max_in_flight))
        .mode("append")
        .save()
    )
    elapsed = time.perf_counter() - start
    df.unpersist()
    return checked(rows / elapsed, options, SINK_STREAM, rows, f"sink, {partitions} partition(s), dedup {dedup}")


def stream_round(spark, stream_url: str, rows: int, max_in_flight: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    options = spc.connection(stream_url)
    out: dict[str, float] = {}
    # rstream counts its confirms, then deletes its stream: its rate stands for confirmed messages.
    out["rstream"] = asyncio.run(spc.rstream_publish(*spc.rstream_login(stream_url), rows))
    ours = asyncio.run(spc.ours_publish(options, rows))
    out["ours"] = checked(ours, options, spc.STREAM, rows, "StreamClient")
    out["sink1"] = stream_sink_rate(spark, stream_url, rows, 1, True, max_in_flight)
    out["sink2"] = stream_sink_rate(spark, stream_url, rows, 2, True, max_in_flight)
    out["nodedup1"] = stream_sink_rate(spark, stream_url, rows, 1, False, max_in_flight)
    return out


STREAM_LABELS = {
    "rstream": "rstream send_batch(500), confirms",
    "ours": "StreamClient, dedup, 500/frame, 20k unconfirmed",
    "sink1": "sink, dedup on, 1 partition",
    "sink2": "sink, dedup on, 2 partitions",
    "nodedup1": "sink, dedup off, 1 partition",
}


def stream_benchmarks(spark, stream_url: str, rows: int, rounds: int, max_in_flight: int) -> None:  # type: ignore[no-untyped-def]
    if rows % spc.BATCH:
        raise SystemExit(f"--rows must be a multiple of {spc.BATCH} with --stream-url (rstream_publish sends batches of {spc.BATCH})")
    stream_sink_rate(spark, stream_url, 20_000, 1, True, max_in_flight)  # warm-up: the stream sink's modules
    loads = [os.getloadavg()]
    runs = []
    for i in range(rounds):
        runs.append(stream_round(spark, stream_url, rows, max_in_flight))
        loads.append(os.getloadavg())
        print(f"  stream round {i + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in runs[-1].items()), flush=True)
    mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
    print(f"\nover the stream protocol ({spc.connection(stream_url).display_uri}), {rows} x {len(BODY)} B, mean of {rounds} round(s);")
    print(f"sink maxInFlight={max_in_flight}; load average (1/5/15 min) " + ", ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in loads))
    for key, label in STREAM_LABELS.items():
        each = " / ".join(f"{r[key]:,.0f}" for r in runs)
        print(f"{label:49s}: {mean[key]:9,.0f} msg/s  {mean[key] / mean['rstream']:.2f}x rstream  ({each})")
    print(f"sink (dedup on, 1 partition) / rstream = {mean['sink1'] / mean['rstream']:.2f}x (goal >= 1.0)")


# -- producer-like against body-only rows (--shape both) ---------------------------------------------


def shaped_frame(spark, shape: str, rows: int):  # type: ignore[no-untyped-def]
    """``rows`` rows of ``shape`` (shapes.py) in one partition, cached: the sink's input columns."""
    import pyarrow as pa

    if shape == "body-only":
        df = spark.range(rows).selectExpr(f"CAST(repeat('x', {len(BODY)}) AS BINARY) as body")
    else:
        df = spark.createDataFrame(pa.Table.from_batches(list(shapes.arrow_batches(shape, rows))))
    df = df.repartition(1).cache()
    df.count()
    return df


def shaped_write(df, uri: str, target: dict[str, str], rows: int) -> tuple[float, CpuMeter]:  # type: ignore[no-untyped-def]
    """msg/s of one ``df.write`` into ``target`` (routingKey or stream) and the CPU it took."""
    writer = df.write.format("amqp").option("uri", uri).options(**target).option("maxInFlight", "1000").mode("append")
    with CpuMeter() as cpu:
        start = time.perf_counter()
        writer.save()
        elapsed = time.perf_counter() - start
    return rows / elapsed, cpu


PERFTEST_PRODUCER = "PerfTest producer, --confirm 1000 (its own messages of the shape's body size)"


def perftest_publish(jars: Path, url: str, queue: str, count: int, size: int) -> float:
    """PerfTest's average rate (msg/s) publishing ``count`` persistent messages of ``size`` bytes with confirms."""
    out = perftest(
        jars,
        url,
        *("--predeclared", "--queue", queue, "--producers", "1", "--consumers", "0", "--flag", "persistent"),
        *("--pmessages", str(count), "--size", str(size), "--confirm", "1000", "--time", "600"),
    )
    found = re.search(r"sending rate avg: (\d+) msg/s", out)
    if not found:
        raise RuntimeError(f"PerfTest did not publish {count} messages:\n{out[-2000:]}")
    return float(found.group(1))


def shape_benchmarks(spark, url: str, stream_url: str | None, queue: str, rows: int, rounds: int) -> None:  # type: ignore[no-untyped-def]
    """Each round, for each shape (in alternating order): raw pika async publishing the same messages, the sink over
    AMQP 0-9-1 and (RabbitMQ 4.x) over AMQP 1.0 from 1 partition, and (with ``stream_url``) the stream sink from 1
    partition with deduplication."""
    amqp10 = int(asyncio.run(server_version(url)).split(".")[0]) >= 4
    results: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    frames = {shape: shaped_frame(spark, shape, rows) for shape in shapes.SHAPES}
    options = spc.connection(stream_url) if stream_url else None
    for df in frames.values():  # warm-up: each shape's paths through the sink once
        shaped_write(df.limit(20_000), url, {"routingKey": queue}, 20_000)
        if amqp10:
            shaped_write(df.limit(20_000), url, {"routingKey": queue, "protocol": "amqp1.0"}, 20_000)
        pb.declare(url, queue)
        if stream_url and options is not None:
            asyncio.run(_fresh_stream(options, SINK_STREAM))
            shaped_write(df.limit(20_000), stream_url, {"stream": SINK_STREAM, "deduplication": "true"}, 20_000)
            asyncio.run(_delete_stream(options, SINK_STREAM))
    loads = [os.getloadavg()]
    for r in range(rounds):
        for shape in shapes.SHAPES if r % 2 == 0 else shapes.SHAPES[::-1]:
            pb.declare(url, queue)
            with CpuMeter() as cpu:
                if shape == "body-only":
                    seconds = pb.publish_async(url, queue, rows, BODY, window=1000)
                else:
                    seconds = pb.publish_async(url, queue, rows, shapes.producer_body, window=1000, properties=shapes.pika_properties)
            results.setdefault(("pika async, 1000 confirms in flight", shape), []).append((rows / seconds, cpu.per_message(rows)))
            if PERFTEST_DIR.is_dir():
                pb.declare(url, queue)
                size = round(shapes.mean_body_size(shape))
                with CpuMeter() as cpu:
                    rate = perftest_publish(PERFTEST_DIR, url, queue, rows, size)
                results.setdefault((PERFTEST_PRODUCER, shape), []).append((rate, cpu.per_message(rows)))
            pb.declare(url, queue)
            rate, cpu = shaped_write(frames[shape], url, {"routingKey": queue}, rows)
            results.setdefault(("sink over AMQP 0-9-1, 1 partition", shape), []).append((rate, cpu.per_message(rows)))
            if amqp10:
                pb.declare(url, queue)
                rate, cpu = shaped_write(frames[shape], url, {"routingKey": queue, "protocol": "amqp1.0"}, rows)
                results.setdefault(("sink over AMQP 1.0, 1 partition", shape), []).append((rate, cpu.per_message(rows)))
            pb.declare(url, queue)
            if stream_url and options is not None:
                asyncio.run(_fresh_stream(options, SINK_STREAM))
                rate, cpu = shaped_write(frames[shape], stream_url, {"stream": SINK_STREAM, "deduplication": "true"}, rows)
                rate = checked(rate, options, SINK_STREAM, rows, f"stream sink, {shape}")
                results.setdefault(("stream sink, dedup on, 1 partition", shape), []).append((rate, cpu.per_message(rows)))
            loads.append(os.getloadavg())
            print(
                f"  round {r + 1}, {shape}: " + ", ".join(f"{k} {v[-1][0]:,.0f}" for (k, sh), v in results.items() if sh == shape),
                flush=True,
            )
    for df in frames.values():
        df.unpersist()
    print(
        f"\nproducer-like against body-only rows, {rows:,} a run, means of {rounds} round(s); load average (1/5/15 min) "
        + ", ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in loads)
    )
    paths = list(dict.fromkeys(k for k, _ in results))
    for path in paths:
        means = {shape: statistics.mean(rate for rate, _ in results[(path, shape)]) for shape in shapes.SHAPES}
        cpu: dict[str, dict[str, float]] = {}
        for shape in shapes.SHAPES:
            versus = ""
            if not path.startswith(("pika", "PerfTest")):
                pika = statistics.mean(rate for rate, _ in results[("pika async, 1000 confirms in flight", shape)])
                versus = f" = {means[shape] / pika:.2f}x pika async"
                if (PERFTEST_PRODUCER, shape) in results:
                    perf = statistics.mean(rate for rate, _ in results[(PERFTEST_PRODUCER, shape)])
                    versus += f", {means[shape] / perf:.2f}x PerfTest"
            cpu[shape] = median_cpu([c for _, c in results[(path, shape)]])
            print(f"  {path}, {shape:9s}: {means[shape]:9,.0f} msg/s{versus}; CPU us/msg (medians): {cpu_text(cpu[shape])}")
        print(f"  {path}: producer-like / body-only {means['producer'] / means['body-only']:.2f}x")
        if not path.startswith(("pika", "PerfTest")):
            print("    " + extra_cpu_text(cpu["body-only"], cpu["producer"]))


def extra_cpu_text(body_only: dict[str, float], producer: dict[str, float]) -> str:
    """Whose is the CPU a producer-like row costs beyond a body-only one: each group's share, and the ratio the
    machine's CPU would allow if the connector's own part (the Python workers) cost no more than for a body alone.
    Where that ratio is short of 0.9, the goal is out of the connector's reach: the rest is the broker's and Spark's."""
    groups = dict.fromkeys([*body_only, *producer])
    extra = {g: producer.get(g, 0.0) - body_only.get(g, 0.0) for g in groups}
    total_body, total_producer = sum(body_only.values()), sum(producer.values())
    without_ours = total_producer - max(extra.get("py workers", 0.0), 0.0)
    parts = ", ".join(f"{g} {us:+.1f}" for g, us in extra.items())
    return (
        f"a producer-like row's extra CPU us: {parts} (total {total_producer - total_body:+.1f}); by CPU alone, "
        f"{total_body / total_producer:.2f}x, and {total_body / without_ours:.2f}x were the workers' extra nil"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sync-rows", type=int, default=20_000)
    parser.add_argument(
        "--stream-url",
        default=os.environ.get("AMQP_TEST_STREAM_URL"),
        help="the broker's rabbitmq-stream:// uri (default: AMQP_TEST_STREAM_URL): also measure the sink over the stream protocol",
    )
    parser.add_argument("--stream-rounds", type=int, default=2, help="times the stream-protocol runs repeat (means reported)")
    parser.add_argument("--stream-max-in-flight", type=int, default=1000, help="the stream sink's maxInFlight (its default: 1000)")
    parser.add_argument("--skip-amqp", action="store_true", help="only the stream-protocol runs (with --stream-url)")
    parser.add_argument(
        "--amqp10-rounds", type=int, default=0, help="pairs of 1-partition sink runs over AMQP 0-9-1 and AMQP 1.0 (RabbitMQ 4.x; medians)"
    )
    parser.add_argument(
        "--shape-rounds",
        type=int,
        default=0,
        help="only rounds of producer-like against body-only rows (benchmarks/shapes.py): pika, the sink over AMQP 0-9-1 "
        "and (with --stream-url) the stream sink, each from 1 partition",
    )
    args = parser.parse_args()
    spark = spark_session("spark-amqp sink benchmark")
    queue = "bench.sink"
    try:
        with broker_url() as (url, label):
            print(f"{args.rows} x {len(BODY)} B into {label}; load average {os.getloadavg()[0]:.2f}")
            sink_rate(spark, url, queue, 20_000, 1)  # warm-up: JVM, Python workers
            if args.shape_rounds:
                shape_benchmarks(spark, url, args.stream_url, queue, args.rows, args.shape_rounds)
                return
            if not args.skip_amqp:
                pb.declare(url, queue)
                raw_async = args.rows / pb.publish_async(url, queue, args.rows, BODY, window=1000)
                pb.declare(url, queue)
                raw_sync = args.sync_rows / pb.publish_sync(url, queue, args.sync_rows, BODY)
                one = sink_rate(spark, url, queue, args.rows, 1)
                two = sink_rate(spark, url, queue, args.rows, 2)
                pb.declare(url, queue)
                print(f"raw pika async, 1000 confirms in flight : {raw_async:9.0f} msg/s")
                print(f"raw pika, one sync confirm per message  : {raw_sync:9.0f} msg/s")
                print(
                    f"sink, 1 partition                       : {one:9.0f} msg/s  {one / raw_async:.2f}x async (goal >= 0.8)  {one / raw_sync:.1f}x sync (goal >= 3)"
                )
                print(f"sink, 2 partitions                      : {two:9.0f} msg/s  {two / raw_async:.2f}x async (goal > 1.0)")
            if args.amqp10_rounds:
                amqp10_benchmarks(spark, url, queue, args.rows, args.amqp10_rounds)
            if args.stream_url:
                stream_benchmarks(spark, args.stream_url, args.rows, args.stream_rounds, args.stream_max_in_flight)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
