"""Batch job: publish the rows of a Delta table to RabbitMQ with ``format("amqp")``.

    python examples/delta_to_amqp.py                       # sample table -> embedded broker
    AMQP_PASSWORD=... python examples/delta_to_amqp.py --table /data/orders \\
        --uri amqp://user@host:5672/vhost --exchange orders --routing-key orders.new

Needs Delta's jars (``make jars``, see examples/sparkenv.py). Without --table it
first writes a small sample table to a temporary folder; without --uri it
starts the bundled in-memory broker, so it runs on a fresh machine.

Columns to messages:
  * a table with a ``body`` column (binary or string) is published as it is:
    the columns the sink knows (routing_key, exchange, headers, message_id,
    content_type, timestamp, ...) become message properties and any other
    column is left out (and named in the output);
  * any other table becomes JSON: ``body = to_json(struct(<every column>))``
    with content_type application/json; columns named like the sink's columns
    also set those properties, and --message-id-column picks a column as the
    message id (which lets a consumer drop duplicates).

Publishing is at least once: every message is confirmed by the broker before
the job succeeds, but a retried task publishes its partition again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
import sys
import tempfile
import time
import urllib.parse

import pika

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparkenv
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.property_columns import INT_PROPERTIES, STRING_PROPERTIES
from spark_amqp.sink.columns import ACCEPTED, SOURCE_ONLY_COLUMNS

DEFAULT_QUEUE = "delta.demo"


def write_sample_table(spark: SparkSession, path: str, rows: int) -> None:
    """Orders with a timestamp, written as a Delta table at ``path``."""
    (
        spark.range(rows)
        .select(
            F.format_string("o-%07d", "id").alias("order_id"),
            F.format_string("c-%03d", F.col("id") % 500).alias("customer"),
            F.round(F.rand(seed=42) * 499 + 1, 2).alias("amount"),
            F.lit("EUR").alias("currency"),
            (F.lit("2026-01-01 00:00:00").cast("timestamp") + F.make_interval(secs=F.col("id"))).alias("created_at"),
        )
        .write.format("delta")
        .mode("overwrite")
        .save(path)
    )


def to_messages(table: DataFrame, message_id_column: str | None) -> DataFrame:
    """The table's rows as the sink's input columns (see the module docstring)."""
    columns = {c.lower(): c for c in table.columns}
    if message_id_column is not None and message_id_column not in table.columns:
        raise SystemExit(f"--message-id-column {message_id_column!r} is not a column of the table: {', '.join(table.columns)}")
    out: dict[str, Column] = {}
    if "body" in columns:
        dropped = [c for c in table.columns if c.lower() not in ACCEPTED and c.lower() not in SOURCE_ONLY_COLUMNS]
        if dropped:
            print(f"  columns left out (the table has a 'body'): {', '.join(dropped)}")
    else:
        out["body"] = F.to_json(F.struct(*[F.col(f"`{c}`") for c in table.columns]))
        out["content_type"] = F.lit("application/json")
    for name in ACCEPTED:
        if name in columns:
            column = F.col(f"`{columns[name]}`")
            # Cast property columns to what the sink takes, e.g. a numeric message_id.
            if name in STRING_PROPERTIES or name in ("routing_key", "exchange"):
                column = column.cast("string")
            elif name in INT_PROPERTIES:
                column = column.cast("int")
            out[name] = column
    if message_id_column is not None:
        out["message_id"] = F.col(f"`{message_id_column}`").cast("string")
    return table.select(*[column.alias(name) for name, column in out.items()])


def queue_depth(url: str, password: str | None, queue: str) -> int:
    """Messages ready in ``queue``, asked with pika (passive declare)."""
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme == "amqps"
    params = pika.ConnectionParameters(
        host=parts.hostname,
        port=parts.port or (5671 if tls else 5672),
        virtual_host=urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
        credentials=pika.PlainCredentials(
            urllib.parse.unquote(parts.username or "guest"),
            password if password is not None else urllib.parse.unquote(parts.password or "guest"),
        ),
        ssl_options=pika.SSLOptions(ssl.create_default_context(), parts.hostname) if tls else None,
    )
    conn = pika.BlockingConnection(params)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The broker password comes from the uri or, better, from the AMQP_PASSWORD environment variable.",
    )
    parser.add_argument("--table", help="path of a Delta table (default: write a sample table to a temporary folder)")
    parser.add_argument("--uri", help="broker, e.g. amqp://user@host:5672/%%2F (default: start the embedded broker)")
    parser.add_argument("--exchange", default="", help="exchange to publish to (default: the default exchange, which routes by queue name)")
    parser.add_argument("--routing-key", help="routing key for rows without a routing_key column (default exchange: --queue)")
    parser.add_argument(
        "--queue",
        help=f"queue to declare (durable) before publishing and to count afterwards, bound to --exchange with --binding-key "
        f"when --exchange is given (default with the default exchange and no --routing-key: {DEFAULT_QUEUE})",
    )
    parser.add_argument("--binding-key", help="binding of --queue to --exchange (default: --routing-key; e.g. '#' on a topic exchange)")
    parser.add_argument("--message-id-column", help="column to use as each message's message_id")
    parser.add_argument("--partitions", type=int, help="repartition the table first: one broker connection per partition")
    parser.add_argument("--sample-rows", type=int, default=10_000, help="rows of the sample table (without --table)")
    args = parser.parse_args()

    if not args.exchange and not args.routing_key and not args.queue:
        args.queue = DEFAULT_QUEUE
    if not args.exchange and not args.routing_key:
        args.routing_key = args.queue

    spark = sparkenv.local_spark("delta-to-amqp", **{"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    password = os.environ.get("AMQP_PASSWORD") if args.uri else None
    broker_context = contextlib.nullcontext(None) if args.uri else EmbeddedBroker()
    with tempfile.TemporaryDirectory(prefix="delta-to-amqp-") as tmp, broker_context as broker:
        table_path = args.table
        message_id_column = args.message_id_column
        if table_path is None:
            table_path = os.path.join(tmp, "orders")
            write_sample_table(spark, table_path, args.sample_rows)
            message_id_column = message_id_column or "order_id"
            print(f"sample Delta table: {args.sample_rows} orders in {table_path}")
        url = args.uri if broker is None else broker.url
        where = "the embedded broker (in memory)" if broker else url.split("@")[-1]
        print(f"publishing {table_path} to {where}: exchange {args.exchange or '(default)'}, routing key {args.routing_key or '(per row)'}")

        messages = to_messages(spark.read.format("delta").load(table_path), message_id_column)
        if args.partitions:
            messages = messages.repartition(args.partitions)
        rows = messages.count()

        writer = messages.write.format("amqp").option("uri", url).option("exchange", args.exchange)
        if password is not None:
            writer = writer.option("password", password)
        if args.routing_key:
            writer = writer.option("routingKey", args.routing_key)
        if args.queue:
            writer = writer.option("declareQueue", args.queue)
            if args.exchange:
                writer = writer.option("bindingKey", args.binding_key if args.binding_key is not None else args.routing_key or "")
        started = time.monotonic()
        writer.mode("append").save()
        elapsed = time.monotonic() - started

        print("summary:")
        print(f"  rows published {rows} (every one confirmed by the broker)")
        print(f"  {elapsed:.2f}s, {rows / elapsed:,.0f} rows/s (the whole Spark job: Python workers starting, connections, confirms)")
        if args.queue:
            print(f"  queue {args.queue} now holds {queue_depth(url, password, args.queue)} messages")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
