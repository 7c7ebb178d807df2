"""Every mode at once on ``local-cluster`` (two workers, executors in JVMs of their own), for the test that SIGKILLs
executors in the middle of a batch (``test_executors_lost.py``).

    executor_kill_job.py --uri AMQP --stream-uri STREAM --queue Q --stream S --out-queue Q --out-stream S
        --out-queue10 Q --work DIR --messages N

Reads the queue (with a journal) and the stream (over each protocol) into Parquet files under ``<work>/<name>``, and
writes N rows of JSON files to the three sinks. In each query, one row (the middle id) stops its task: the task's
Python worker writes its executor's JVM pid to ``<work>/kill/<name>.pid`` and waits, so the test SIGKILLs that
executor while the task is mid-batch (a stream range part read, a sink partition part published, its messages
unconfirmed or unsettled as far as Spark knows). Once ``<work>/kill/<name>.killed`` exists the row passes. Spark
runs the lost tasks again on the executor its worker starts in place of the dead one. Prints ``DONE`` once every
read has N ids and every sink has taken N rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

HOLD = 240  # seconds a marked row waits for the kill, at most


def executor_jvm_pid() -> int:
    """The pid of the JVM that started this Python worker (its nearest ``java`` ancestor)."""
    pid = os.getpid()
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state is the parent pid
        if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
            return pid
    return -1


def hold_for_kill(kills: str, name: str, message_id: str, marked: str) -> bool:
    """True, after the kill when ``message_id`` is the query's marked row and its executor was not yet killed."""
    if message_id != marked:
        return True
    done = Path(kills) / f"{name}.killed"
    if done.exists():
        return True
    # Written whole, then renamed: the test polls for the file and once read it while it was still empty (CI run ci66).
    written = Path(kills) / f"{name}.pid.partial"
    written.write_text(str(executor_jvm_pid()))
    written.rename(written.with_suffix(""))
    deadline = time.monotonic() + HOLD
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return True


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--uri", "--stream-uri", "--queue", "--stream", "--out-queue", "--out-stream", "--out-queue10", "--work"):
        p.add_argument(name, required=True)
    p.add_argument("--messages", type=int, required=True)
    args = p.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    work, n = Path(args.work), args.messages
    kills = work / "kill"
    kills.mkdir(parents=True, exist_ok=True)

    from pyspark import cloudpickle
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this script
    builder = SparkSession.builder.appName("spark-amqp executors lost").config("spark.ui.enabled", "false")
    builder = builder.config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
    # Small Arrow batches: a sink task publishes its first rows before it reaches the marked one.
    builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    # Each SIGKILL fails the tasks on that executor (by Spark's count, an exit the application caused), and a new
    # executor's Python workers have 10 s to connect back, which a loaded machine can miss: four failures of one task,
    # Spark's default, are within this test's violence. A CI run failed so early, with the cause cut from its output.
    builder = builder.config("spark.task.maxFailures", "8")
    builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.master("local-cluster[2,2,1024]").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    hold = F.udf(lambda name, mid, marked: hold_for_kill(str(kills), name, mid, marked), "boolean")

    rows_dir = work / "rows"
    rows_dir.mkdir(exist_ok=True)
    for f in range(n // 100):
        lines = (json.dumps({"body": f"k{f * 100 + i}", "message_id": f"k{f * 100 + i}"}) + "\n" for i in range(100))
        (rows_dir / f"{f}.json").write_text("".join(lines))
    common = {"connectionTimeout": "5", "maxMessagesPerTrigger": "100"}
    queries = {}

    def read(name: str, uri: str, marked: str, **options: str) -> None:
        df = spark.readStream.format("amqp").option("uri", uri).options(**common, **options).load().select("message_id")
        df = df.where(hold(F.lit(name), "message_id", F.lit(marked)))
        writer = df.writeStream.format("parquet").option("path", str(work / name)).option("checkpointLocation", str(work / f"c-{name}"))
        start(name, writer)

    def write(name: str, uri: str, **options: str) -> None:
        rows = spark.readStream.schema("body string, message_id string").option("maxFilesPerTrigger", 1).json(str(rows_dir))
        rows = rows.where(hold(F.lit(name), "message_id", F.lit(f"k{n // 2 + 10}")))
        writer = rows.selectExpr("CAST(body AS BINARY) AS body", "message_id").writeStream.format("amqp").option("uri", uri)
        writer = writer.options(connectionTimeout="5", **options).option("checkpointLocation", str(work / f"c-{name}"))
        start(name, writer)

    def start(name: str, writer: Any) -> None:
        """The query started and past its first batch, one at a time: each start launches Python workers, and on a
        loaded machine several at once missed Spark's 10 s to connect back. Such a start is tried again (its
        checkpoint is still empty), three times at most."""
        writer = writer.trigger(processingTime="2 seconds").queryName(name)
        for _ in range(3):
            query = queries[name] = writer.start()
            deadline = time.monotonic() + 180
            while query.lastProgress is None and query.exception() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if query.exception() is None or "failed to connect back" not in str(query.exception()):
                return

    middle = n // 2 + 10
    read("queue", args.uri, f"q{middle}", queue=args.queue, journalLocation=str(work / "journal"))
    read("stream-protocol", args.stream_uri, f"s{middle}", stream=args.stream)
    # Over AMQP, what was not delivered is asked on the same node's stream port (not 5552 here: another broker's).
    port = str(urllib.parse.urlsplit(args.stream_uri).port)
    read("stream-amqp", args.uri, f"s{middle}", stream=args.stream, streamPort=port)
    read("stream-amqp10", args.uri, f"s{middle}", stream=args.stream, protocol="amqp1.0", streamPort=port)
    write("sink-amqp", args.uri, routingKey=args.out_queue)
    write("sink-stream", args.stream_uri, stream=args.out_stream)
    write("sink-amqp10", args.uri, routingKey=args.out_queue10, protocol="amqp1.0")
    print("STARTED", flush=True)

    def read_ids(name: str) -> int:
        if not list((work / name).glob("*.parquet")):
            return 0
        return spark.read.parquet(str(work / name)).count()

    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        failed = {k: str(q.exception())[:3000] for k, q in queries.items() if q.exception() is not None}
        if failed:
            print("FAILED", json.dumps(failed), flush=True)
            sys.exit(1)
        # Counted from the progress (a batch's comes once it is committed), not by reading the files: four Spark jobs
        # every two seconds took a core from the queries. The test reads the committed files once at the end.
        if all(sum(p.numInputRows for p in q.recentProgress) >= n for q in queries.values()):
            break
        time.sleep(2)
    else:
        print("TIMEOUT", {k: read_ids(k) for k in queries if not k.startswith("sink")}, flush=True)
        sys.exit(1)
    for query in queries.values():
        query.stop()
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
