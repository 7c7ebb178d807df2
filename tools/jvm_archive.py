"""The Spark work whose classes go into the tests' class-data-sharing archive (``make`` runs it, see TEST_JVM).

A JVM started with ``-XX:ArchiveClassesAtExit=FILE`` writes the classes it loaded to FILE as it exits; a JVM started
with ``-XX:SharedArchiveFile=FILE`` and the same class path maps them instead of loading and verifying each again.
The tests start dozens of Spark JVMs on two cores (each crash test restarts its job; local-cluster executors, Spark
Connect servers), and a local session writing and reading a small Delta table took 30 s of CPU without the archive
and 20 s with it, measured here. So this runs, in the venv whose PySpark it archives, what those JVMs do: a session
(with Delta where its jars are for this line), a streaming read of the embedded broker's queue and stream into
Parquet (and Delta), and a batch write back through the sink.

    JAVA_TOOL_OPTIONS="-XX:ArchiveClassesAtExit=.cache/cds/venv.jsa" .venv/bin/python tools/jvm_archive.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pika
from spark_amqp_broker import EmbeddedBroker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def main() -> None:
    sys.path.insert(0, str(EXAMPLES))
    import pyspark
    import sparkenv
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv's spark_amqp, as in the tests
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # on loopback, as the tests' sessions (conf binds the driver too)
    delta = sparkenv.has_delta_jars_for(pyspark.__version__) and sparkenv.jars_dir().is_dir()
    conf = sparkenv.delta_conf() if delta else sparkenv.LOCAL_CONF
    spark = SparkSession.builder.master("local[2]").appName("jvm-archive").config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as work:
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.queue_declare("q")
        channel.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
        for i in range(20):
            for queue in ("q", "s"):
                channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(message_id=f"m{i}"))
        channel.connection.close()
        sink = "delta" if delta else "parquet"
        for mode, name in (("queue", "q"), ("stream", "s")):
            target = f"{work}/{name}"
            source = spark.readStream.format("amqp").option("uri", broker.url).option(mode, name).load()
            writer = source.select("message_id", "body").writeStream.format(sink).option("checkpointLocation", f"{work}/c-{name}")
            query = writer.trigger(availableNow=True).start(target)
            if not query.awaitTermination(300):
                query.stop()
            written = spark.read.format(sink).load(target)
            written.write.format("amqp").option("uri", broker.url).option("routingKey", "q").mode("append").save()
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    # The JVM ends when its stdin closes (as when this process exits) and only then writes the archive: wait for it,
    # or make would go on with a partial file.
    jvm.stdin.close()
    jvm.wait(timeout=600)


if __name__ == "__main__":
    main()
