"""Sink throughput against raw pika publishers, side by side in the same run.

    AMQP_TEST_URL=amqp://guest:guest@127.0.0.1:5672/%2F python benchmarks/sink_throughput.py

Writes ``--rows`` x 200-byte rows with ``df.write.format("amqp")`` from one and
from two partitions (the DataFrame is cached first, so only publishing is
timed), and compares with pika's SelectConnection keeping 1000 confirms
outstanding and with pika's BlockingConnection doing one synchronous confirm per
message (on ``--sync-rows`` messages, it is slow). Without AMQP_TEST_URL the
embedded broker runs in its own process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika_baseline as pb
from source_throughput import broker_url
from spark_runs import spark_session

BODY = b"x" * 200


def sink_rate(spark, url: str, queue: str, rows: int, partitions: int) -> float:  # type: ignore[no-untyped-def]
    df = spark.range(rows).selectExpr("repeat('x', 200) as body").repartition(partitions).cache()
    df.count()
    pb.declare(url, queue)
    start = time.perf_counter()
    df.write.format("amqp").option("uri", url).option("routingKey", queue).option("maxInFlight", "1000").mode("append").save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sync-rows", type=int, default=20_000)
    args = parser.parse_args()
    spark = spark_session("spark-amqp sink benchmark")
    queue = "bench.sink"
    try:
        with broker_url() as (url, label):
            print(f"{args.rows} x {len(BODY)} B into {label}")
            sink_rate(spark, url, queue, 20_000, 1)  # warm-up: JVM, Python workers
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
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
