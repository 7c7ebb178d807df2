"""Producer names and publishing ids for the stream-protocol sink's deduplication.

RabbitMQ keeps, per stream, the highest publishing id it stored for each producer name
(the publisher "reference"), and drops a message whose id is not higher, confirming it
all the same. A retried task and a replayed micro-batch must therefore publish the same
rows under the same name with the same ids, and every row of a later batch must get a
higher id than any row of an earlier one:

- name: ``<query id>-<partition id>`` for a streaming write (Spark's query id is kept in
  the checkpoint, so a restarted query has the same one), ``write-<write id>-<partition
  id>`` for a batch write (the write id is drawn on the driver when Spark creates the
  writer, and travels pickled to every task, retries included);
- id: ``(batch id << 32) + the row's position in the partition's output`` (a batch write
  is batch 0), or the row's own ``publishing_id`` column.

A task learns its partition (``TaskContext.partitionId``), the query id and the micro-batch
id from the job's local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``, which
MicroBatchExecution sets; measured on PySpark 4.0.5 and 4.2.0, tests/spark/test_stream_sink.py).
Spark also copies its SQL session's ``spark.*`` settings there (``SQLExecution.withSQLConfPropagated``),
which is how a task sees ``spark.speculation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import AmqpOptionError

__all__ = ["MAX_NAMES", "ROW_BITS", "Producer", "TaskLocals", "producer_for", "task_producer"]

ROW_BITS = 32  # a batch's ids start at batch << 32: up to 2**32 rows per partition and batch
# osiris (RabbitMQ's stream log) keeps the names of 255 producers per stream when it starts a new
# segment file (osiris_tracking's max_sequences, not configurable from RabbitMQ); the least recently
# used ones past that are forgotten, and a retry under a forgotten name is stored again.
MAX_NAMES = 255
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
SPECULATION = "spark.speculation"


@dataclass(frozen=True)
class Producer:
    """What one task publishes under: ``name`` is None without deduplication (nothing is dropped)."""

    name: str | None
    first_id: int  # the id of the partition's first row (own ids: unused)
    description: str  # for the connection's name and errors: the partition, and the batch when streaming

    def id_of(self, row: int) -> int:
        if row >= 1 << ROW_BITS:
            raise AmqpOptionError(
                f"partition holds more than {1 << ROW_BITS} rows in one batch, more than the sink's publishing ids can number: "
                "repartition into more partitions"
            )
        return self.first_id + row


class TaskLocals(Protocol):
    """What a task asks Spark (``pyspark.TaskContext``): its partition and the job's local properties."""

    def partitionId(self) -> int: ...  # Spark's names

    def getLocalProperty(self, key: str) -> str | None: ...


def producer_for(prefix: str, partition: int, batch: int | None, deduplication: bool = True) -> Producer:
    """The producer of ``partition`` of a write (``batch`` None) or of a micro-batch."""
    description = f"partition {partition}" if batch is None else f"partition {partition} of batch {batch}"
    if not deduplication:
        return Producer(None, 0, description)
    return Producer(f"{prefix}-{partition}", (batch or 0) << ROW_BITS, description)


def task_producer(context: TaskLocals, write_id: str | None, deduplication: bool) -> Producer:
    """This task's producer. ``write_id``: the batch writer's (``write-<uuid>``); None for a streaming write,
    whose task takes the query id and batch id from Spark. Fails (before anything is published) where
    deduplication could not hold: speculative tasks, more producers than the broker tracks, no batch id."""
    partition = context.partitionId()
    batch: int | None = None
    if write_id is not None:
        prefix = write_id
    else:
        query, batch_text = context.getLocalProperty(QUERY_ID), context.getLocalProperty(BATCH_ID)
        if deduplication and (not query or not batch_text or not batch_text.isdigit()):
            raise AmqpOptionError(
                f"deduplication needs the streaming query's id and micro-batch id, which this Spark task does not have "
                f"(local properties {QUERY_ID}={query!r}, {BATCH_ID}={batch_text!r}); set deduplication=false to publish "
                "at least once"
            )
        prefix, batch = query or "", int(batch_text) if batch_text and batch_text.isdigit() else None
    if not deduplication:
        return producer_for(prefix, partition, batch, False)
    if (context.getLocalProperty(SPECULATION) or "").strip().lower() == "true":
        raise AmqpOptionError(
            "spark.speculation is on: a speculative copy of a task would publish the same rows under the same producer "
            "name at the same time as the task itself. Turn speculation off for this job, or set deduplication=false to "
            "publish at least once"
        )
    if partition >= MAX_NAMES:
        raise AmqpOptionError(
            f"this write has more than {MAX_NAMES} partitions (this is partition {partition}); RabbitMQ keeps the producer "
            f"names of {MAX_NAMES} publishers per stream, and a retry under one it forgot would be stored twice. "
            f"Coalesce to at most {MAX_NAMES} partitions (df.coalesce({MAX_NAMES})), or set deduplication=false"
        )
    return producer_for(prefix, partition, batch)
