"""The main job: stream an AMQP queue into a Delta table, exactly once, on the embedded broker.

    make demo            # or: python examples/amqp_to_delta.py [--messages N] [--uri amqp://...] [--no-journal]

Starts the bundled broker (unless --uri points at a real RabbitMQ), publishes
sample order events with message ids while a Structured Streaming query reads
them with ``format("amqp")`` and appends them to a Delta table with a
checkpoint and a batch journal (``journalLocation``: what makes a replayed
batch identical, so the table gets every message exactly once). Prints
progress every second (rows/s and backlog) and ends with a summary that checks
every order is in the table exactly once and the queue was left empty with
nothing unacknowledged.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import threading
import time

import pika

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from sparkenv import local_spark

from spark_amqp.broker import EmbeddedBroker

QUEUE = "demo.orders"
ORDER_SCHEMA = "order_id STRING, customer STRING, amount DOUBLE, currency STRING"


def publish_orders(url: str, count: int, stop: threading.Event, sent: list[int]) -> None:
    """Publishes ``count`` JSON orders with message ids, in bursts, with confirms."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()
    rng = random.Random(42)
    for i in range(count):
        if stop.is_set():
            break
        order = {
            "order_id": f"o-{i:07d}",
            "customer": f"c-{rng.randrange(500):03d}",
            "amount": round(rng.uniform(1, 500), 2),
            "currency": "EUR",
        }
        props = pika.BasicProperties(
            message_id=order["order_id"], content_type="application/json", delivery_mode=2, timestamp=int(time.time())
        )
        ch.basic_publish("", QUEUE, json.dumps(order).encode(), props)
        sent[0] = i + 1
        if i % 1000 == 999:
            time.sleep(0.2)  # about 5k messages/s in bursts, so progress is visible
    conn.close()


def queue_depth(url: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(QUEUE, passive=True).method.message_count)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--uri", help="a real broker instead of the embedded one, e.g. amqp://guest:guest@127.0.0.1:5672/%%2F")
    parser.add_argument("--output", default="demo-output", help="the Delta table, checkpoint and journal go here")
    parser.add_argument("--no-journal", action="store_true", help="at-least-once: no batch journal")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()

    broker = None if args.uri else EmbeddedBroker().start()
    url = args.uri or broker.url  # type: ignore[union-attr]
    where = "embedded broker (in memory)" if broker else "RabbitMQ"
    table_path = os.path.join(args.output, "orders")
    print(f"spark-amqp: {args.messages} orders from {where} into the Delta table {table_path}", flush=True)
    shutil.rmtree(args.output, ignore_errors=True)

    spark = local_spark(
        "spark-amqp amqp_to_delta",
        **{
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",  # a small table: Delta's default is 50 tasks
        },
    )
    spark.sparkContext.setLogLevel("ERROR")

    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=publish_orders, args=(url, args.messages, stop, sent), daemon=True)
    producer.start()
    while sent[0] == 0 and producer.is_alive():
        time.sleep(0.05)

    source = spark.readStream.format("amqp").option("uri", url).option("queue", QUEUE).option("maxMessagesPerTrigger", "5000")
    if not args.no_journal:
        # Durable storage next to the checkpoint; one journal per query.
        source = source.option("journalLocation", os.path.join(args.output, "_journal"))
    orders = (
        source.load()
        .select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o"), "redelivered", F.col("timestamp").alias("published_at"))
        .select("o.*", "redelivered", "published_at")
    )
    counter = RowCounter()
    spark.streams.addListener(counter)
    query = (
        orders.writeStream.format("delta")
        .option("checkpointLocation", os.path.join(args.output, "_checkpoint"))
        .queryName("amqp_orders")
        .start(table_path)
    )

    started = time.monotonic()
    written = 0
    last_written, last_time = 0, started
    try:
        while True:
            time.sleep(1)
            written = counter.rows
            now = time.monotonic()
            rate = (written - last_written) / (now - last_time)
            last_written, last_time = written, now
            queued = queue_depth(url)
            print(
                f"  {now - started:5.1f}s  published {sent[0]:>7}  written {written:>7}  {rate:8.0f} rows/s  "
                f"backlog {sent[0] - written:>7} (ready in the queue {queued})",
                flush=True,
            )
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            if not producer.is_alive() and written >= sent[0]:
                break
            if now - started > args.timeout:
                print("  timed out", flush=True)
                break
    finally:
        stop.set()
        query.stop()

    table = spark.read.format("delta").load(table_path)
    total = table.count()
    distinct = table.select("order_id").distinct().count()
    left = queue_depth(url)
    elapsed = time.monotonic() - started
    print("summary:")
    print(f"  published {sent[0]}, written {total} rows, {distinct} distinct order ids, duplicates {total - distinct}")
    print(f"  {elapsed:.1f}s end to end, {total / elapsed:.0f} rows/s including query start-up")
    print(f"  left in the queue after the query stopped: {left} (0 means every message was acknowledged)")
    table.groupBy("currency").agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total")).show()
    spark.stop()
    if broker is not None:
        broker.stop()
    ok = total == sent[0] == distinct and left == 0
    print("OK: every order exactly once, queue empty" if ok else "FAILED", flush=True)
    return 0 if ok else 1


class RowCounter(StreamingQueryListener):
    """Counts rows over every batch (recentProgress keeps only the last 100)."""

    def __init__(self) -> None:
        self.rows = 0

    def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
        self.rows += event.progress.numInputRows

    def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
        pass


if __name__ == "__main__":
    raise SystemExit(main())
