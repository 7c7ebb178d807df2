"""Spark's writer classes for the AMQP sink: batch (``df.write``) and streaming.

``write`` runs in executors and publishes its partition (``PartitionPublisher``);
it returns only when every message is confirmed, and its commit message
carries the counts. ``commit``/``abort`` run on the driver and log per batch.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage

from ..options import SinkOptions
from .columns import MessageBuilder
from .publisher import PartitionPublisher

try:  # PySpark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase

    STREAM_ARROW = True
except ImportError:  # PySpark 4.0: rows, converted to Arrow here
    _StreamBase = DataSourceStreamWriter  # type: ignore[assignment,misc]
    STREAM_ARROW = False

log = logging.getLogger("spark_amqp.sink")


@dataclass
class AmqpCommitMessage(WriterCommitMessage):
    partition: str
    published: int
    confirmed: int


def _publish_partition(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> AmqpCommitMessage:
    builder = MessageBuilder(options)
    partition = uuid.uuid4().hex[:8]
    result = asyncio.run(PartitionPublisher(options).publish((builder.messages(b) for b in batches), partition))
    return AmqpCommitMessage(partition, result.published, result.confirmed)


def _rows_to_batches(rows: Iterator[Any], chunk: int = 4096) -> Iterator[pa.RecordBatch]:
    buffer: list[dict[str, Any]] = []
    for row in rows:
        buffer.append(row.asDict())
        if len(buffer) >= chunk:
            yield pa.RecordBatch.from_pylist(buffer)
            buffer = []
    if buffer:
        yield pa.RecordBatch.from_pylist(buffer)


def _log_commit(messages: list[Any], batch_id: int | None) -> None:
    done = [m for m in messages if isinstance(m, AmqpCommitMessage)]
    published = sum(m.published for m in done)
    confirmed = sum(m.confirmed for m in done)
    where = f"batch {batch_id}" if batch_id is not None else "write"
    log.info("AMQP sink %s: %d messages confirmed by the broker from %d partitions", where, confirmed, len(done))
    if published != confirmed:  # cannot happen: write() fails unless all are confirmed
        log.error("AMQP sink %s: %d published but %d confirmed", where, published, confirmed)


def _log_abort(messages: list[Any], batch_id: int | None) -> None:
    done = [m for m in messages if isinstance(m, AmqpCommitMessage)]
    where = f"batch {batch_id}" if batch_id is not None else "write"
    # A failed task sends no commit message: what it confirmed before failing is
    # only in its own error, so count completed partitions and say so.
    log.warning(
        "AMQP sink %s aborted: %d of %d partitions completed (%d messages confirmed); the failed ones may have "
        "had part of their messages confirmed before failing (their task errors give the counts). A retry "
        "publishes all of them again (at-least-once)",
        where,
        len(done),
        len(messages),
        sum(m.confirmed for m in done),
    )


class AmqpBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AmqpCommitMessage:
        return _publish_partition(self.options, iterator)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(messages, None)

    def abort(self, messages: list[Any]) -> None:
        _log_abort(messages, None)


class AmqpStreamWriter(_StreamBase):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> AmqpCommitMessage:
        batches = iterator if STREAM_ARROW else _rows_to_batches(iterator)
        return _publish_partition(self.options, batches)

    def commit(self, messages: list[Any], batchId: int) -> None:
        _log_commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        _log_abort(messages, batchId)
