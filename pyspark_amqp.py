"""Auto-registration shim: Spark imports installed ``pyspark_*`` modules and registers
their ``DefaultSource``, so ``format("amqp")`` works right after ``pip install``."""

from spark_amqp.datasource import AmqpDataSource as DefaultSource

__all__ = ["DefaultSource"]
