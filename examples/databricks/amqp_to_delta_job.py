"""Databricks job: one RabbitMQ queue into one Delta table (see job.json and README.md).

    amqp_to_delta_job.py --secret-scope rabbitmq --uri amqps://ingest@rabbit.example.com:5671/prod \\
        --queue orders --table main.ingest.orders_raw --volume /Volumes/main/ingest/amqp

By default it runs with ``trigger(availableNow=True)``: it takes what the queue
holds, writes it, and stops, so the job can run on a schedule on a job cluster.
``--processing-time "30 seconds"`` keeps the query running instead (a
continuous job).
"""

from __future__ import annotations

import argparse
import re

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_amqp.datasource import AmqpDataSource


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--secret-scope", required=True, help="Databricks secret scope holding the RabbitMQ password")
    parser.add_argument("--secret-key", default="rabbitmq-password", help="key of the password in the scope")
    parser.add_argument("--uri", required=True, help="amqps://user@host:5671/vhost (no password in it)")
    parser.add_argument("--queue", required=True, help="the queue to read; one query (one job) per queue")
    parser.add_argument("--table", required=True, help="Delta table to append to, catalog.schema.table")
    parser.add_argument("--volume", required=True, help="UC volume for the journal and checkpoint, /Volumes/<catalog>/<schema>/<volume>")
    parser.add_argument("--query-name", help="name of the query, and of its journal and checkpoint folders (default: from --queue)")
    parser.add_argument("--processing-time", help='run continuously with this trigger interval, e.g. "30 seconds" (default: availableNow)')
    parser.add_argument("--max-messages-per-trigger", default="10000")
    args = parser.parse_args()

    spark = SparkSession.builder.getOrCreate()
    spark.dataSource.register(AmqpDataSource)  # format("amqp") without relying on auto-registration

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

    messages = (
        spark.readStream.format("amqp")
        .option("uri", args.uri)
        .option("password", password)
        .option("queue", args.queue)
        .option("journalLocation", journal)
        .option("maxMessagesPerTrigger", args.max_messages_per_trigger)
        .load()
        .drop("delivery_tag")  # meaningful only on the channel that delivered it
        .withColumn("ingested_at", F.current_timestamp())
    )

    writer = messages.writeStream.format("delta").queryName(query_name).option("checkpointLocation", checkpoint)
    # availableNow on Spark 4.2+: everything the queue held at the start. Spark 4.0/4.1 (DBR 17.x)
    # have no admission control for Python sources: one batch of up to maxMessagesPerTrigger.
    trigger = {"processingTime": args.processing_time} if args.processing_time else {"availableNow": True}
    query = writer.trigger(**trigger).toTable(args.table)
    print(f"query {query_name}: queue {args.queue} -> {args.table}; journal {journal}; checkpoint {checkpoint}")
    query.awaitTermination()  # raises if the query failed, so the job run fails (and retries)
    progress = query.lastProgress
    if progress:
        print(f"last batch {progress['batchId']}: {progress['numInputRows']} rows")


if __name__ == "__main__":
    main()
