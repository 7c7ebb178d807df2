"""``AmqpDataSource``: wires Spark's data source API to the reader and writer."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .errors import AmqpOptionError
from .queues.options import SourceOptions, parse_source_options
from .reading.arrow import SCHEMA_DDL, STREAM_SCHEMA_DDL
from .sink.options import SinkOptions, parse_sink_options
from .streams.options import StreamSourceOptions, is_stream_mode, parse_stream_options

__all__ = ["AmqpDataSource"]


class AmqpDataSource(DataSource):
    """AMQP brokers as a Spark streaming source and sink. It speaks AMQP 0-9-1 (RabbitMQ), AMQP 1.0
    (RabbitMQ 4 and ActiveMQ Artemis: option ``protocol=amqp1.0``) and RabbitMQ's stream protocol
    (a ``rabbitmq-stream://`` uri): it reads queues (option ``queue``) and RabbitMQ streams (option
    ``stream``), and writes to exchanges, queues and streams.

    Name: ``amqp``. Schema (fixed): ``body`` binary, ``queue``, ``exchange``,
    ``routing_key``, ``delivery_tag``, ``redelivered``, the message properties
    under pika's names, ``timestamp`` and ``headers`` (map<string,string>).
    In stream mode (option ``stream``), ``offset`` replaces ``delivery_tag`` and
    ``redelivered``. ``.schema(...)`` with some of these columns, of the same
    types, reads only those (docs/queue-source.md, "Choosing columns").

    Options: see the option tables in docs/queue-source.md, docs/streams.md and docs/sink.md. Example::

        spark.readStream.format("amqp")
            .option("uri", "amqp://user@rabbit:5672/%2F")
            .option("password", secret)
            .option("queue", "orders")
            .load()
    """

    @classmethod
    def name(cls) -> str:
        return "amqp"

    def schema(self) -> str:
        # Spark asks for the schema at load(): fail there, before anything connects.
        options = self.source_options()
        return STREAM_SCHEMA_DDL if isinstance(options, StreamSourceOptions) else SCHEMA_DDL

    def sink_options(self, schema: StructType) -> SinkOptions:
        from .sink.columns import check_schema

        options = parse_sink_options(self.options)
        check_schema(schema, options)  # on the driver, before any task publishes
        return options

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink.writer import AmqpBatchWriter

        return AmqpBatchWriter(self.sink_options(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink.writer import AmqpStreamWriter

        return AmqpStreamWriter(self.sink_options(schema), schema)

    def source_options(self, schema: StructType | None = None) -> SourceOptions | StreamSourceOptions:
        """The options, and the columns ``schema`` asks for: checked here, before anything connects. With a schema given
        to the reader, Spark calls no Python at load() (PythonDataSourceV2.getTable), so a bad one fails here, at
        the read's planning or the query's start."""
        if is_stream_mode(self.options):
            return parse_stream_options(self.options, schema)
        return parse_source_options(self.options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self.source_options(schema)
        if isinstance(options, StreamSourceOptions):
            from .streams.batch import StreamBatchReader

            return StreamBatchReader(options)
        raise AmqpOptionError(
            f"spark.read cannot read queue '{options.queues[0]}': a batch read has no point at which Spark has committed "
            "its rows, so it could never acknowledge them safely. Read a stream queue with option 'stream' (a bounded "
            "range, nothing acknowledged), or this queue with spark.readStream and trigger(availableNow=True)"
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self.source_options(schema)
        if isinstance(options, StreamSourceOptions):
            from .streams.reader import StreamReader

            return StreamReader(options)
        from .queues.reader import QueueReader

        return QueueReader(options)
