"""The streaming source: ``spark.readStream.format("amqp")``."""

from .reader import AmqpInputPartition, AmqpStreamReader

__all__ = ["AmqpInputPartition", "AmqpStreamReader"]
