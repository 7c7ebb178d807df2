"""The streaming write the stream-sink kill test SIGKILLs: text files -> a stream, over the stream protocol.

Run in its own process group. With ``--kill-in-commit``, the writer's ``commit`` (which Spark calls
on the driver once every task of the batch has published and had every message confirmed, and
before it writes the batch to the checkpoint's commit log) SIGKILLs the whole group the first time
it sees each batch: the Python driver, the JVM and every Python worker die between the publish and
Spark's commit, as a machine failure would. The next run replays that batch from the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from spark_amqp.datasource import AmqpDataSource
from spark_amqp.sink.writer import AmqpStreamWriter


class KillingWriter(AmqpStreamWriter):
    markers = ""

    def commit(self, messages: list[Any], batchId: int) -> None:
        marker = Path(self.markers) / str(batchId)
        if not marker.exists():
            marker.touch()
            os.killpg(int(os.environ["SINK_KILL_GROUP"]), signal.SIGKILL)
        super().commit(messages, batchId)


class KillingSource(AmqpDataSource):
    @classmethod
    def name(cls) -> str:
        return "amqp-killed-in-commit"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        markers = self.options.pop("test.markers")
        writer = KillingWriter(self.sink_options(schema), schema)
        writer.markers = markers
        return writer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--markers", required=True)
    p.add_argument("--deduplication", default="true")
    p.add_argument("--kill-in-commit", action="store_true")
    args = p.parse_args()
    os.environ["SINK_KILL_GROUP"] = str(os.getpgid(0))  # the JVM and its Python workers inherit it

    import sparkenv
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import this script
    spark = sparkenv.local_spark("spark-amqp-sink-kill-job", master="local[2]", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KillingSource)
    rows = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(args.source).repartition(2)
    fmt = KillingSource.name() if args.kill_in_commit else "amqp"
    writer = rows.selectExpr("value AS body").writeStream.format(fmt).option("uri", args.uri).option("stream", args.stream)
    writer = writer.option("deduplication", args.deduplication).option("checkpointLocation", args.checkpoint)
    if args.kill_in_commit:
        writer = writer.option("test.markers", args.markers)
    query = writer.trigger(availableNow=True).start()
    print("STARTED", flush=True)
    query.awaitTermination()
    print("FINISHED", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
