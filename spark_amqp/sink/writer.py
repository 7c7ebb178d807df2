"""Spark's writer classes for the AMQP sink: batch (``df.write``) and streaming.

``write`` runs in executors and publishes its partition: over AMQP 0-9-1 (``PartitionPublisher``), over AMQP 1.0
with protocol=amqp1.0 (``Amqp10PartitionPublisher``), or with a rabbitmq-stream:// uri over the stream protocol (``StreamPartitionPublisher``, under the
producer name and ids of ``producers.py``); it returns only when every message is confirmed, and its
commit message carries the counts. ``commit``/``abort`` run on the driver and log per batch.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..client import AmqpClient
from ..client.super_streams import partitions_of
from ..errors import AmqpOptionError, AmqpProtocolError, AmqpPublishError, AmqpSourceError, explain
from ..transport.outage import retried_since
from .amqp10_messages import Amqp10MessageBuilder
from .amqp10_publisher import Amqp10PartitionPublisher
from .columns import MessageBuilder
from .options import SinkOptions
from .producers import task_producer
from .publisher import PartitionPublisher
from .stream_publisher import StreamPartitionPublisher

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


def _publish_partition(
    options: SinkOptions, batches: Iterator[pa.RecordBatch], write_id: str | None, planned_at: float
) -> AmqpCommitMessage:
    """``write_id``: the batch writer's (producer names of a batch write); None when streaming. ``planned_at``: when the
    driver made the writer of this write or micro-batch, from which Spark's retries of the task count an outage."""
    since = retried_since(planned_at)
    if options.connection.stream_protocol:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise AmqpOptionError("the stream sink publishes from Spark tasks only")
        producer = task_producer(context, write_id, options.deduplication)
        done = asyncio.run(StreamPartitionPublisher(options, producer, since).publish(batches))
        return AmqpCommitMessage(producer.description, done.published, done.confirmed)
    partition = uuid.uuid4().hex[:8]
    if options.connection.amqp10:
        result = asyncio.run(Amqp10PartitionPublisher(options, Amqp10MessageBuilder(options), since).publish(batches, partition))
        return AmqpCommitMessage(partition, result.published, result.confirmed)
    builder = MessageBuilder(options)
    publisher = PartitionPublisher(options, since)
    result = asyncio.run(publisher.publish((builder.messages(b) for b in batches), partition, connected(builder)))
    return AmqpCommitMessage(partition, result.published, result.confirmed)


def connected(builder: MessageBuilder) -> Callable[[AmqpClient], Awaitable[None]]:
    """What the builder must learn from the broker before the first message: its version (the default
    message size limit) and, writing to a super stream, its partitions."""

    async def learn(client: AmqpClient) -> None:
        builder.met(client.server_version)
        name = builder.options.super_stream
        if name is not None:
            try:
                builder.route_to(await partitions_of(client, name))
            except AmqpSourceError as err:  # none found: the same words as the source's
                raise AmqpPublishError(f"{err}; nothing was published") from None
            except AmqpProtocolError as err:
                c = builder.options.connection
                raise AmqpPublishError(
                    f"{explain(err, c.display_uri, c.username, c.vhost, f'super stream {name!r}')}; nothing was published"
                ) from err

    return learn


_ARROW_TYPES = {
    "binary": pa.binary(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def _arrow_type(spark_type: Any) -> pa.DataType:
    name = spark_type.typeName()
    if name == "map":
        return pa.map_(_arrow_type(spark_type.keyType), _arrow_type(spark_type.valueType))
    if name == "decimal":
        return pa.decimal128(spark_type.precision, spark_type.scale)
    return _ARROW_TYPES[name]


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of the sink's input (``check_schema`` already limited it to these types)."""
    return pa.schema([(f.name, _arrow_type(f.dataType)) for f in schema.fields])


def _utc(value: Any) -> Any:
    # Rows carry TIMESTAMP values as naive local times.
    if isinstance(value, datetime.datetime) and value.tzinfo is None:
        return value.astimezone(datetime.UTC)
    if isinstance(value, dict):
        return {k: _utc(v) for k, v in value.items()}
    return value


def _rows_to_batches(rows: Iterator[Any], schema: pa.Schema, chunk: int = 4096) -> Iterator[pa.RecordBatch]:
    """Rows (PySpark 4.0's streaming writer) to Arrow batches of the input's own schema.

    The explicit schema matters: inferred from dicts, a ``headers`` map becomes
    a struct whose fields are every key of every row, so one row's header keys
    would appear (as nulls) on the next.
    """
    zoned = [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz] + [
        f.name for f in schema if pa.types.is_map(f.type) and pa.types.is_timestamp(f.type.item_type)
    ]
    buffer: list[dict[str, Any]] = []
    for row in rows:
        record = row.asDict()
        for name in zoned:
            record[name] = _utc(record[name])
        buffer.append(record)
        if len(buffer) >= chunk:
            yield pa.RecordBatch.from_pylist(buffer, schema=schema)
            buffer = []
    if buffer:
        yield pa.RecordBatch.from_pylist(buffer, schema=schema)


def _log_commit(messages: list[Any], batch_id: int | None) -> None:
    done = [m for m in messages if isinstance(m, AmqpCommitMessage)]
    published = sum(m.published for m in done)
    confirmed = sum(m.confirmed for m in done)
    where = f"batch {batch_id}" if batch_id is not None else "write"
    log.info("AMQP sink %s: %d messages confirmed by the broker from %d partitions", where, confirmed, len(done))
    if published != confirmed:  # cannot happen: write() fails unless all are confirmed
        log.error("AMQP sink %s: %d published but %d confirmed", where, published, confirmed)


def _log_abort(messages: list[Any], batch_id: int | None, options: SinkOptions) -> None:
    done = [m for m in messages if isinstance(m, AmqpCommitMessage)]
    where = f"batch {batch_id}" if batch_id is not None else "write"
    deduplicated = options.connection.stream_protocol and options.deduplication
    # A failed task sends no commit message: what it confirmed before failing is
    # only in its own error, so count completed partitions and say so.
    log.warning(
        "AMQP sink %s aborted: %d of %d partitions completed (%d messages confirmed); the failed ones may have "
        "had part of their messages confirmed before failing (their task errors give the counts). %s",
        where,
        len(done),
        len(messages),
        sum(m.confirmed for m in done),
        "A retry publishes them again under the same producer names and ids: the broker stores each once (deduplication)"
        if deduplicated
        else "A retry publishes all of them again (at-least-once)",
    )


class AmqpBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # Drawn once, on the driver: every task of this write, retries included, publishes under it.
        self.write_id = f"write-{uuid.uuid4()}"
        self.planned_at = time.time()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AmqpCommitMessage:
        return _publish_partition(self.options, iterator, self.write_id, self.planned_at)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(messages, None)

    def abort(self, messages: list[Any]) -> None:
        _log_abort(messages, None, self.options)


class AmqpStreamWriter(_StreamBase):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        # Spark makes the writer anew on the driver for each micro-batch (its writer factory asks Python for one
        # each time), just before the batch's tasks: so this is when the batch's write began.
        self.planned_at = time.time()

    def write(self, iterator: Iterator[Any]) -> AmqpCommitMessage:
        batches = iterator if STREAM_ARROW else _rows_to_batches(iterator, arrow_schema(self.schema))
        return _publish_partition(self.options, batches, None, self.planned_at)

    def commit(self, messages: list[Any], batchId: int) -> None:
        _log_commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        _log_abort(messages, batchId, self.options)
