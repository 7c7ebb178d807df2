"""One round trip through ``format("amqp")`` on a Spark that is not the shared local session.

    deploy_job.py --mode connect|local-cluster [--remote sc://HOST:PORT] [--register] --uri URL --password PW \\
        --in-queue Q --out-queue Q --messages N --work DIR

Reads ``--in-queue`` into parquet (``<work>/out``) to its end, as the Databricks example
does (``examples/databricks/amqp_to_delta_job.py``: an AvailableNow run on Spark 4.2+,
processing-time batches stopped once the queue is drained on 4.0/4.1), then
writes N rows with ``df.write.format("amqp")`` to ``--out-queue``. ``connect`` is a
client of the Spark Connect server at ``--remote`` (the test starts it: ``connect_server.py``);
``local-cluster`` runs a master and two workers whose executors are separate JVMs, on
loopback, and records next to every row the JVM pid of the Python worker that handled it.
Each needs a process of its own: a process holds one SparkContext, and a Connect client
cannot start beside a classic session (SESSION_ALREADY_EXIST).

With ``--register`` the module scan that Spark's auto-registration runs is made
blind to ``pyspark_amqp`` (see ``hidden/sitecustomize.py``): the job checks that
``format("amqp")`` is then not found, calls ``spark_amqp.register(spark)``, and
goes on. Prints ``DONE`` at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

DATABRICKS_JOB = Path(__file__).resolve().parents[2] / "examples" / "databricks" / "amqp_to_delta_job.py"


def databricks_job():  # type: ignore[no-untyped-def]
    """The Databricks example's module (its drain loop), loaded from its file."""
    spec = importlib.util.spec_from_file_location("amqp_to_delta_job", DATABRICKS_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executor_jvm_pid() -> int:
    """The pid of the JVM that started this Python worker (its nearest ``java`` ancestor)."""
    pid = os.getpid()
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state is the parent pid
        if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
            return pid
    return -1


def session(mode: str, remote: str | None):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"spark-amqp {mode}")
    builder = builder.config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
    if mode == "connect":
        assert remote, "--mode connect needs --remote"
        return builder.remote(remote).getOrCreate()
    # Two workers of one core and 1 GiB each: executors in JVMs of their own, on loopback.
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    return builder.config("spark.driver.bindAddress", "127.0.0.1").master("local-cluster[2,1,1024]").getOrCreate()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["connect", "local-cluster"], required=True)
    parser.add_argument("--remote")
    parser.add_argument("--register", action="store_true")
    for name in ("--uri", "--password", "--in-queue", "--out-queue", "--work"):
        parser.add_argument(name, required=True)
    parser.add_argument("--messages", type=int, required=True)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    work = Path(args.work)

    spark = session(args.mode, args.remote)
    amqp = {"uri": args.uri, "password": args.password}

    if args.register:
        try:
            spark.read.format("amqp").options(**amqp, queue=args.in_queue).load().schema  # noqa: B018
        except Exception as e:
            assert "DATA_SOURCE_NOT_FOUND" in str(e), e
            print("NOT FOUND before register", flush=True)
        else:
            raise AssertionError("format('amqp') was found although the module scan cannot see pyspark_amqp")
        import spark_amqp

        spark_amqp.register(spark)

    stream = spark.readStream.format("amqp").options(**amqp, queue=args.in_queue).load()
    if args.mode == "local-cluster":
        from pyspark.sql import functions as F

        stream = stream.withColumn("jvm", F.udf(executor_jvm_pid, "int")())
    writer = stream.writeStream.format("parquet").option("path", str(work / "out")).option("checkpointLocation", str(work / "checkpoint"))
    job = databricks_job()
    if job.available_now_drains(spark.version):
        query = writer.trigger(availableNow=True).start()
        assert query.awaitTermination(240), "the AvailableNow query did not finish"
        assert query.exception() is None, query.exception()
    else:
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1s")
        query = writer.trigger(processingTime="1 second").start()
        job.drain_with_batches(query, lambda: job.ready_messages({**amqp, "queue": args.in_queue}), poll_seconds=0.5)
    print(f"Spark {spark.version}: read {sum(job.input_rows(p) for p in query.recentProgress)} rows", flush=True)

    rows = spark.range(args.messages).selectExpr("cast(id as string) as body", "concat('w', id) as message_id").repartition(2)
    rows.write.format("amqp").options(**amqp, routingKey=args.out_queue).mode("append").save()

    info = {"mode": args.mode}
    if args.mode == "local-cluster":
        sc = spark.sparkContext
        info["driver_jvm"] = sc._jvm.java.lang.ProcessHandle.current().pid()
        info["executors"] = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
    (work / "info.json").write_text(json.dumps(info))
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
