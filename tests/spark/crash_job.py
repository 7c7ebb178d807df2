"""The streaming query the crash tests kill: AMQP queue (or stream) -> Delta table, with a checkpoint.

Run as a subprocess in its own process group, so one SIGKILL to the group
takes down the Python driver, the JVM and the source runner at once, as a
machine or container failure would. With ``--kill-after-delta-commit`` a
thread in the driver watches the table's ``_delta_log`` and kills the group
the moment a new Delta version appears: after the sink committed the batch,
before Spark writes the batch's entry in the checkpoint's commit log.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def kill_after_next_delta_commit(table: str) -> None:
    log_dir = os.path.join(table, "_delta_log")

    def versions() -> set[str]:
        try:
            return {n for n in os.listdir(log_dir) if n.endswith(".json")}
        except FileNotFoundError:
            return set()

    seen = versions()

    def watch() -> None:
        while True:
            if versions() - seen:
                os.killpg(0, signal.SIGKILL)
            time.sleep(0.0005)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--stream", action="store_true", help="the queue is a stream: read it in stream mode")
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--journal")
    p.add_argument("--available-now", action="store_true")
    p.add_argument("--kill-after-delta-commit", action="store_true")
    p.add_argument("--max-per-trigger", default="400")
    p.add_argument("--protocol", help="option 'protocol' (amqp1.0: read the queue over AMQP 1.0)")
    p.add_argument("--shared-queue", action="store_true", help="exclusiveConsumer=false (Artemis)")
    args = p.parse_args()

    import sparkenv

    small_and_quiet = {
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": "2",  # a tiny table: Delta's default 50 tasks per log read
        "spark.ui.showConsoleProgress": "false",
    }
    spark = sparkenv.local_spark("spark-amqp-crash-job", master="local[2]", **small_and_quiet)
    spark.sparkContext.setLogLevel("ERROR")
    reader = spark.readStream.format("amqp").option("uri", args.uri).option("maxMessagesPerTrigger", args.max_per_trigger)
    if args.stream:
        # Two tasks per batch: executors read offset ranges themselves.
        reader = reader.option("stream", args.queue).option("numPartitions", "2")
        columns = ["message_id", "CAST(body AS STRING) AS body", "offset"]
    else:
        reader = reader.option("queue", args.queue)
        columns = ["message_id", "CAST(body AS STRING) AS body", "redelivered"]
    if args.protocol:
        reader = reader.option("protocol", args.protocol)
    if args.shared_queue:
        reader = reader.option("exclusiveConsumer", "false")
    if args.journal:
        reader = reader.option("journalLocation", args.journal)
    rows = reader.load().selectExpr(*columns)
    writer = rows.writeStream.format("delta").option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="200 milliseconds")
    if args.kill_after_delta_commit:
        kill_after_next_delta_commit(args.table)
    query = writer.start(args.table)
    print("STARTED", flush=True)
    query.awaitTermination()
    print("FINISHED", flush=True)
    spark.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
