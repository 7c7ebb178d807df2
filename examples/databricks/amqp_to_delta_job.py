"""Databricks job: drain one RabbitMQ queue into one Delta table (see job.json and README.md).

    amqp_to_delta_job.py --secret-scope rabbitmq --uri amqps://ingest@rabbit.example.com:5671/prod \\
        --queue orders --table main.ingest.orders_raw --volume /Volumes/main/ingest/amqp

Each run reads what the queue holds, writes it, and stops, whatever the runtime:

- Spark 4.2+ (Databricks Runtime 19+): one ``trigger(availableNow=True)`` run, in batches of
  at most ``--max-messages-per-trigger``.
- Spark 4.0 / 4.1 (Runtime 17.3 LTS, 18 LTS): Python sources have no AvailableNow there (Spark
  would run one batch and never tell the source it was committed, so it would never be
  acknowledged). The job runs processing-time batches instead and stops once the query has
  reported ``--idle-batches`` consecutive empty triggers and a passive declare finds no
  ready message in the queue (``drain_with_batches``).

``--processing-time "30 seconds"`` without ``--drain`` keeps the query running instead (a
continuous job).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Callable
from typing import Any


def spark_line(version: str) -> tuple[int, int]:
    """``"4.1.0"`` (``spark.version``) -> ``(4, 1)``."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def available_now_drains(version: str) -> bool:
    """Whether a Python source's ``availableNow`` run reads a queue to its end on this Spark."""
    return spark_line(version) >= (4, 2)


def ready_messages(options: dict[str, str]) -> int:
    """Messages ready in the queue(s) of these source options (one passive declare each),
    measured with the connector's own client, so TLS and the password work as for the source."""
    from spark_amqp.client.connection import AmqpClient
    from spark_amqp.client.consumer import queue_depths
    from spark_amqp.queues.options import parse_source_options

    parsed = parse_source_options(options)

    async def measure() -> int:
        client = await AmqpClient.connect(parsed.connection, "spark-amqp drain check")
        try:
            return sum((await queue_depths(client, parsed.queues)).values())
        finally:
            await client.close()

    return asyncio.run(measure())


def input_rows(event: Any) -> int:
    """A progress event's input rows. Spark Connect's events carry them only per source: the
    ``numInputRows`` property adds them up, while ``event["numInputRows"]`` is None there."""
    rows = getattr(event, "numInputRows", None)
    return int(event["numInputRows"] if rows is None else rows)


def idle_triggers(progress: list[Any]) -> int:
    """How many progress events (``query.recentProgress``) since the last batch that read rows reported no input rows."""
    idle = 0
    for event in reversed(progress):
        if input_rows(event):
            break
        idle += 1
    return idle


def drain_with_batches(
    query: Any,
    ready: Callable[[], int],
    idle_batches: int = 2,
    poll_seconds: float = 2.0,
    max_seconds: float | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Stops a processing-time ``query`` once the queue is drained (Spark 4.0 / 4.1).

    Drained: the last ``idle_batches`` progress events read nothing (so the source's buffer
    was empty at each of those triggers, and the call that found it empty also acknowledged
    every committed batch) and ``ready()`` (a passive declare) finds nothing on the broker.
    Stopping a query is always safe: a batch that was not committed is not acknowledged
    and its messages go back to the queue (with a journal, the next run replays it).
    After ``max_seconds`` it stops anyway (a queue that never empties), leaving the rest to
    the next run. Raises the query's exception if it failed.
    """
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    try:
        while query.awaitTermination(poll_seconds) is False:
            if deadline is not None and time.monotonic() > deadline:
                log(f"still reading after {max_seconds:.0f}s; stopping, the next run goes on")
                return
            idle = idle_triggers(query.recentProgress)
            if idle >= idle_batches:
                left = ready()
                if left == 0:
                    log(f"queue drained: {idle} empty triggers in a row and no ready message; stopping")
                    return
                log(f"{left} messages still ready in the queue; going on")
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--secret-scope", required=True, help="Databricks secret scope holding the RabbitMQ password")
    parser.add_argument("--secret-key", default="rabbitmq-password", help="key of the password in the scope")
    parser.add_argument("--uri", required=True, help="amqps://user@host:5671/vhost (no password in it)")
    parser.add_argument("--queue", required=True, help="the queue to read; one query (one job) per queue")
    parser.add_argument("--table", required=True, help="Delta table to append to, catalog.schema.table")
    parser.add_argument("--volume", required=True, help="UC volume for the journal and checkpoint, /Volumes/<catalog>/<schema>/<volume>")
    parser.add_argument("--query-name", help="name of the query, and of its journal and checkpoint folders (default: from --queue)")
    parser.add_argument(
        "--processing-time", default="10 seconds", help="trigger interval of the batches on Spark 4.0/4.1, and with --continuous"
    )
    parser.add_argument("--continuous", action="store_true", help="never stop: processing-time batches (a continuous job)")
    parser.add_argument("--idle-batches", type=int, default=2, help="Spark 4.0/4.1: empty triggers in a row that end the run")
    parser.add_argument("--max-minutes", type=float, default=50, help="Spark 4.0/4.1: stop a run that is still reading after this long")
    parser.add_argument("--max-messages-per-trigger", default="10000")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_amqp

    spark = SparkSession.builder.getOrCreate()
    # A cluster library is found by Spark's own lookup; a notebook-scoped %pip install or
    # serverless compute is not. Registering explicitly works everywhere.
    spark_amqp.register(spark)

    # The secret goes to Spark only as the 'password' option: Spark redacts options with that
    # name in plans and the UI, and the connector never logs it. Databricks does not redact
    # secrets in the driver's stdout/stderr logs, so never print it or put it in the uri.
    from pyspark.dbutils import DBUtils

    password = DBUtils(spark).secrets.get(scope=args.secret_scope, key=args.secret_key)

    query_name = args.query_name or "amqp_" + re.sub(r"[^A-Za-z0-9_]+", "_", args.queue)
    volume = args.volume.rstrip("/")
    # Both on a volume, so they survive cluster restarts (a job cluster's local disk does
    # not): the journal keeps each planned batch, so a batch Spark replays after a crash is
    # rebuilt from it instead of from the broker (RabbitMQ cannot replay); the checkpoint
    # holds Spark's offsets and commits. They belong to this one query: never share them.
    journal = f"{volume}/amqp-journal/{query_name}"
    checkpoint = f"{volume}/checkpoints/{query_name}"
    amqp = {"uri": args.uri, "password": password, "queue": args.queue}

    messages = (
        spark.readStream.format("amqp")
        .options(**amqp)
        .option("journalLocation", journal)
        .option("maxMessagesPerTrigger", args.max_messages_per_trigger)
        .load()
        .drop("delivery_tag")  # meaningful only on the channel that delivered it
        .withColumn("ingested_at", F.current_timestamp())
    )
    writer = messages.writeStream.format("delta").queryName(query_name).option("checkpointLocation", checkpoint)

    drains = available_now_drains(spark.version)
    mode = "continuous" if args.continuous else "availableNow" if drains else f"batches every {args.processing_time} until drained"
    trigger = {"availableNow": True} if drains and not args.continuous else {"processingTime": args.processing_time}
    query = writer.trigger(**trigger).toTable(args.table)
    print(f"Spark {spark.version}, {mode}: queue {args.queue} -> {args.table}; journal {journal}; checkpoint {checkpoint}", flush=True)
    started = time.monotonic()
    if args.continuous or drains:
        query.awaitTermination()  # raises if the query failed, so the job run fails (and retries)
    else:
        drain_with_batches(query, lambda: ready_messages(amqp), idle_batches=args.idle_batches, max_seconds=60 * args.max_minutes)
    rows = sum(input_rows(p) for p in query.recentProgress)
    print(f"done in {time.monotonic() - started:.0f}s: {rows} rows in the last {len(query.recentProgress)} progress events", flush=True)


if __name__ == "__main__":
    main()
