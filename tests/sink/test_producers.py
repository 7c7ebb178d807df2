"""Producer names and publishing ids: what a task publishes under, from what Spark tells it (no Spark here:
tests/spark/test_stream_sink.py runs the same through real tasks)."""

from __future__ import annotations

import pytest

from spark_amqp.errors import AmqpOptionError
from spark_amqp.sink.producers import MAX_NAMES, producer_for, task_producer


class Task:
    def __init__(self, partition: int, **properties: str) -> None:
        self.partition = partition
        self.properties = properties

    def partitionId(self) -> int:
        return self.partition

    def getLocalProperty(self, key: str) -> str | None:
        return self.properties.get(key)


STREAMING = {"sql.streaming.queryId": "6f0c-query", "streaming.sql.batchId": "12"}


def test_a_streaming_task_publishes_under_the_query_and_partition_from_its_batchs_ids() -> None:
    p = task_producer(Task(3, **STREAMING), None, True)
    assert (p.name, p.first_id, p.description) == ("6f0c-query-3", 12 << 32, "partition 3 of batch 12")
    assert p.id_of(5) == (12 << 32) + 5
    # The next batch's first id is above every id of this one.
    assert task_producer(Task(3, **{**STREAMING, "streaming.sql.batchId": "13"}), None, True).id_of(0) > p.id_of((1 << 32) - 1)


def test_a_batch_write_publishes_under_its_write_id_as_batch_0() -> None:
    p = task_producer(Task(1), "write-abc", True)
    assert (p.name, p.first_id, p.description) == ("write-abc-1", 0, "partition 1")


def test_without_deduplication_there_is_no_name() -> None:
    assert task_producer(Task(1, **STREAMING), None, False).name is None
    assert task_producer(Task(1), None, False).name is None  # no batch id needed then


def test_a_streaming_task_without_a_batch_id_refuses_to_deduplicate() -> None:
    with pytest.raises(AmqpOptionError, match=r"deduplication needs the streaming query's id and micro-batch id.*deduplication=false"):
        task_producer(Task(0, **{"sql.streaming.queryId": "q"}), None, True)


def test_speculation_is_refused() -> None:
    with pytest.raises(AmqpOptionError, match=r"spark\.speculation is on.*Turn speculation off.*deduplication=false"):
        task_producer(Task(0, **STREAMING, **{"spark.speculation": "true"}), None, True)
    assert task_producer(Task(0, **STREAMING, **{"spark.speculation": "false"}), None, True).name is not None
    assert task_producer(Task(0, **STREAMING, **{"spark.speculation": "true"}), None, False).name is None


def test_more_partitions_than_the_broker_keeps_names_for_are_refused() -> None:
    assert task_producer(Task(MAX_NAMES - 1), "write-a", True).name == f"write-a-{MAX_NAMES - 1}"
    with pytest.raises(AmqpOptionError, match=r"more than 255 partitions .*Coalesce to at most 255"):
        task_producer(Task(MAX_NAMES), "write-a", True)


def test_a_partition_holds_at_most_2_to_the_32_rows_a_batch() -> None:
    with pytest.raises(AmqpOptionError, match="more than 4294967296 rows in one batch"):
        producer_for("q", 0, 1).id_of(1 << 32)
