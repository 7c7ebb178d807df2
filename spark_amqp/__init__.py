"""spark-amqp: RabbitMQ / AMQP 0-9-1 connector for PySpark Structured Streaming."""

__version__ = "0.1.0"

__all__ = ["__version__"]
