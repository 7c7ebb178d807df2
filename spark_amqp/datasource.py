"""``AmqpDataSource``: wires Spark's data source API to the reader and writer."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from .options import SourceOptions, parse_source_options
from .source.arrow import SCHEMA_DDL

__all__ = ["AmqpDataSource"]


class AmqpDataSource(DataSource):
    """RabbitMQ / AMQP 0-9-1 queues as a Spark streaming source.

    Name: ``amqp``. Schema (fixed): ``body`` binary, ``queue``, ``exchange``,
    ``routing_key``, ``delivery_tag``, ``redelivered``, the message properties
    under pika's names, ``timestamp`` and ``headers`` (map<string,string>).

    Options: see the README's options table. Example::

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
        self.source_options()
        return SCHEMA_DDL

    def source_options(self) -> SourceOptions:
        return parse_source_options(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source.reader import AmqpStreamReader

        return AmqpStreamReader(self.source_options())
