"""The main job: stream an AMQP queue into a Delta table, exactly once, on the embedded broker.

    make demo            # or: python examples/amqp_to_delta.py [--messages N] [--uri amqp://...] [--no-journal]

Starts the bundled broker (unless --uri points at a real RabbitMQ), publishes
sample order events with message ids in the background (the connector's own
publisher: a window of 1000 unconfirmed messages, tens of thousands a second, so
a backlog builds up at once) while a Structured Streaming query reads them with
``format("amqp")`` and appends them to a Delta table with a checkpoint and a
batch journal (``journalLocation``: what makes a replayed batch identical, so the
table gets every message exactly once). Prints progress every second (the
connector's read rate and the backlog going down) and ends with a summary that
checks every order is in the table exactly once and the queue was left empty
with nothing unacknowledged. On a real broker the password goes to Spark as the
``password`` option, never inside the uri, and the demo deletes its queue at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pika
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from spark_amqp_broker import EmbeddedBroker
from sparkenv import local_spark

from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.publisher import PartitionPublisher

QUEUE = "demo.orders"  # on a real broker with a suffix of its own, so that runs never share a queue
ORDER_SCHEMA = "order_id STRING, customer STRING, amount DOUBLE, currency STRING"


def publish_orders(url: str, queue: str, count: int, stop: threading.Event, sent: list[int], failed: list[BaseException]) -> None:
    """Publishes ``count`` JSON orders with message ids as fast as the broker confirms them.

    With the connector's own publisher (the sink's): persistent messages, up to 1000
    unconfirmed at a time; ``sent[0]`` counts what was handed to it. A nack or a lost
    connection ends up in ``failed``.
    """
    options = parse_sink_options({"uri": url, "routingKey": queue, "maxInFlight": "1000"})
    builder = MessageBuilder(options)
    rng = random.Random(42)

    def batches(size: int = 2000) -> Iterator[pa.RecordBatch]:
        for first in range(0, count, size):
            if stop.is_set():
                return
            ids = [f"o-{i:07d}" for i in range(first, min(first + size, count))]
            orders = [
                {"order_id": i, "customer": f"c-{rng.randrange(500):03d}", "amount": round(rng.uniform(1, 500), 2), "currency": "EUR"}
                for i in ids
            ]
            now = int(time.time())
            batch = pa.record_batch(
                {
                    "body": [json.dumps(o).encode() for o in orders],
                    "message_id": ids,
                    "content_type": ["application/json"] * len(ids),
                    "timestamp": [now] * len(ids),
                }
            )
            yield builder.messages(batch)
            sent[0] = first + len(ids)  # the batch before this one is all out (not all confirmed yet)

    try:
        asyncio.run(PartitionPublisher(options).publish(batches(), "demo publisher"))
    except BaseException as err:  # shown by the main loop
        failed.append(err)


def without_password(url: str) -> tuple[str, str | None]:
    """The uri without its password, and the password (Spark gets it as the 'password' option)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), parts.password


def queue_depth(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def declare_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(queue, durable=True)
    finally:
        conn.close()


def delete_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--uri", help="a real broker instead of the embedded one, e.g. amqp://guest:guest@127.0.0.1:5672/%%2F")
    parser.add_argument("--output", default="demo-output", help="the Delta table, checkpoint and journal go here")
    parser.add_argument("--no-journal", action="store_true", help="at-least-once: no batch journal")
    parser.add_argument("--max-messages-per-trigger", type=int, default=20_000)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()

    broker = None if args.uri else EmbeddedBroker().start()
    url = args.uri or broker.url  # type: ignore[union-attr]
    where = "embedded broker (in memory)" if broker else "RabbitMQ"
    table_path = os.path.join(args.output, "orders")
    print(f"spark-amqp: {args.messages} orders from {where} into the Delta table {table_path}", flush=True)
    shutil.rmtree(args.output, ignore_errors=True)
    queue = QUEUE if broker is not None else f"{QUEUE}.{uuid.uuid4().hex[:8]}"
    declare_queue(url, queue)

    # The publisher starts first: while Spark starts (about 10 s) a backlog builds up.
    stop = threading.Event()
    sent, failed = [0], []  # type: ignore[var-annotated]
    producer = threading.Thread(target=publish_orders, args=(url, queue, args.messages, stop, sent, failed), daemon=True)
    producer.start()

    spark = local_spark(
        "spark-amqp amqp_to_delta",
        **{
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",  # a small table: Delta's default is 50 tasks
        },
    )
    spark.sparkContext.setLogLevel("ERROR")

    uri, password = without_password(url)
    source = (
        spark.readStream.format("amqp")
        .option("uri", uri)  # no password in it: Spark prints option values, but redacts 'password'
        .option("queue", queue)
        .option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
        .option("numPartitions", "2")  # a task per core for the JSON parsing and the Delta write
    )
    if password is not None:
        source = source.option("password", password)
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
    try:
        while True:
            time.sleep(1)
            written = counter.rows
            now = time.monotonic()
            print(
                f"  {now - started:5.1f}s  published {sent[0]:>7}  written {written:>7}  "
                f"read {counter.steady_rate():6.0f} rows/s (last batch {counter.last_rows:>6} rows)  backlog {backlog(query, url, queue)}",
                flush=True,
            )
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            if failed:
                raise RuntimeError(f"the demo's publisher failed: {failed[0]}")
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
    left = queue_depth(url, queue)
    elapsed = time.monotonic() - started
    print("summary:")
    print(f"  published {sent[0]}, written {total} rows, {distinct} distinct order ids, duplicates {total - distinct}")
    print(
        f"  read rate into Delta: {counter.steady_rate():.0f} rows/s steady (every batch after the first, which waits for "
        f"the query's start-up), {counter.batches} batches; {total / elapsed:.0f} rows/s including query start-up ({elapsed:.1f}s)"
    )
    if counter.planning_ms:
        print(
            f"  the source planned {counter.rows} rows in {counter.planning_ms / 1000:.1f}s of {counter.batch_ms / 1000:.1f}s of batches "
            f"({counter.rows / (counter.planning_ms / 1000):.0f} rows/s): the rest is Spark and Delta writing and committing"
        )
    print(f"  left in the queue after the query stopped: {left} (0 means every message was acknowledged)")
    table.groupBy("currency").agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total")).show()
    spark.stop()
    if broker is not None:
        broker.stop()
    else:
        delete_queue(url, queue)
        print(f"  deleted the queue {queue} on RabbitMQ")
    ok = total == sent[0] == distinct and left == 0
    print("OK: every order exactly once, queue empty" if ok else "FAILED", flush=True)
    return 0 if ok else 1


def backlog(query, url: str, queue: str) -> str:  # type: ignore[no-untyped-def]
    """What is left to read: the source's own report on PySpark 4.2+ (ready on the broker plus
    prefetched, docs/queue-source.md, "Backlog in the query's progress"), else the queue's ready count."""
    progress = query.lastProgress
    latest = progress.sources[0].latestOffset if progress is not None and progress.sources else None
    if latest:
        entry = json.loads(latest)[queue]
        return f"{entry['ready'] + entry['prefetched']} (source)"
    return f"{queue_depth(url, queue)} (ready)"


class RowCounter(StreamingQueryListener):
    """Counts rows over every batch (recentProgress keeps only the last 100) and the time the batches took."""

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0
        self.last_rows = 0
        self.first_rows = 0
        self.first_end: float | None = None
        self.last_end: float | None = None
        self.planning_ms = 0  # the source's latestOffset: take deliveries, build the batch's Arrow data (and journal it)
        self.batch_ms = 0  # whole triggers: planning, reading the partitions, Delta's write and commit, Spark's logs

    def steady_rate(self) -> float:
        """Rows per second from the end of the first batch to the end of the last one."""
        if self.first_end is None or self.last_end is None or self.last_end <= self.first_end:
            return 0.0
        return (self.rows - self.first_rows) / (self.last_end - self.first_end)

    def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
        progress = event.progress
        if not progress.numInputRows:
            return
        self.last_end = time.monotonic()
        self.rows += progress.numInputRows
        self.last_rows = progress.numInputRows
        self.batches += 1
        self.planning_ms += progress.durationMs.get("latestOffset", 0)
        self.batch_ms += progress.durationMs.get("triggerExecution", 0)
        if self.first_end is None:
            self.first_end, self.first_rows = self.last_end, self.rows

    def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
        pass

    def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
        pass


if __name__ == "__main__":
    raise SystemExit(main())
