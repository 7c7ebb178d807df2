"""The stream-protocol sink under Spark: a streaming write whose batches fail after they were published and
before Spark committed them, then run again from the checkpoint, holds every row once with deduplication
(and some twice without it, which shows the test can fail).

The failure is injected in the writer's ``commit`` (which Spark calls after every task of the batch has
succeeded, i.e. after every message was confirmed, and before it writes the batch to the checkpoint's
commit log): the query stops there, as a killed driver would, and the next run replays the batch with the
same rows, the same query id and the same batch id. In-process, so the session the other Spark tests use
serves (a killed JVM costs ~15 s a run; tests/spark/test_exactly_once.py does that for the source).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from spark_amqp.datasource import AmqpDataSource
from spark_amqp.sink.writer import AmqpStreamWriter
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from tests.sink.stream_helpers import create, delete, records, run
from tests.stream_protocol.conftest import STREAM_BROKERS

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

FILES, LINES = 5, 40  # one file a batch (maxFilesPerTrigger=1): 5 batches of 40 rows
FAILED_BATCHES = 3


class CommitFailsOnce(AmqpStreamWriter):
    """Fails the first commit of each batch: the batch was published, Spark never records it as done."""

    markers = ""

    def commit(self, messages: list[Any], batchId: int) -> None:
        marker = Path(self.markers) / str(batchId)
        if not marker.exists():
            marker.touch()
            raise RuntimeError(f"injected failure after batch {batchId} was published")
        super().commit(messages, batchId)


class FailingCommitSource(AmqpDataSource):
    @classmethod
    def name(cls) -> str:
        return "amqp-commit-fails-once"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        markers = self.options.pop("test.markers")
        writer = CommitFailsOnce(self.sink_options(schema), schema)
        writer.markers = markers
        return writer


@pytest.fixture(scope="module")
def stream_url() -> Iterator[str]:
    """The newest real RabbitMQ's stream port, else the embedded broker's."""
    if STREAM_BROKERS:
        yield STREAM_BROKERS[max(STREAM_BROKERS, key=lambda name: tuple(int(p) for p in name.split(".")))]
        return
    from spark_amqp.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.stream_url


@pytest.mark.parametrize("deduplication", ["true", "false"])
def test_batches_replayed_after_failing_between_publish_and_commit(spark, stream_url: str, tmp_path: Path, deduplication: str) -> None:  # type: ignore[no-untyped-def]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tasks cannot import the tests package
    spark.dataSource.register(FailingCommitSource)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        path = source / f"f{f}.txt"
        path.write_text("".join(f"f{f}-line{i:02d}\n" for i in range(LINES)))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the file source takes files oldest first: f0 is batch 0
    stream = f"sink-{tmp_path.name[-20:]}"
    create(stream_url, stream)
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        rows = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(source)).repartition(2)

        def writer(fmt: str) -> Any:
            w = rows.selectExpr("value AS body").writeStream.format(fmt).option("uri", stream_url).option("stream", stream)
            w = w.option("deduplication", deduplication).option("checkpointLocation", str(tmp_path / "checkpoint"))
            return w.option("test.markers", str(markers)) if fmt != "amqp" else w

        query_ids = set()
        for batch in range(FAILED_BATCHES):  # each run replays the batch the one before failed, then fails the next
            query = writer(FailingCommitSource.name()).trigger(processingTime="100 milliseconds").start()
            query_ids.add(query.id)
            with pytest.raises(Exception, match=f"injected failure after batch {batch} was published"):
                query.awaitTermination(300)
        query = writer("amqp").trigger(availableNow=True).start()
        query_ids.add(query.id)
        assert query.awaitTermination(300) and query.exception() is None
        (query_id,) = query_ids  # Spark keeps the query id in the checkpoint: the producer names stay the same

        async def sequences(c: Any) -> list[int]:
            return [await c.publisher_sequence(f"{query_id}-{p}", stream) for p in range(2)]

        # Each task learnt the query id, its partition and the batch id from Spark: the last batch (4) of 40 rows
        # was split 20 and 20, so each partition's name last stored id (4 << 32) + 19.
        last = (FILES - 1 << 32) + LINES // 2 - 1
        assert run(stream_url, sequences) == ([last, last] if deduplication == "true" else [0, 0])
    finally:
        got = records(stream_url, stream)
        delete(stream_url, stream)

    expected = sorted(f"f{f}-line{i:02d}".encode() for f in range(FILES) for i in range(LINES))
    bodies = [RowMaker(stream, Conversion.of(None)).row(r, 0)[0] for r in got]
    if deduplication == "true":
        assert sorted(bodies) == expected
    else:  # each failed batch was published twice
        replayed = sorted(f"f{f}-line{i:02d}".encode() for f in range(FAILED_BATCHES) for i in range(LINES))
        assert sorted(bodies) == sorted(expected + replayed)
