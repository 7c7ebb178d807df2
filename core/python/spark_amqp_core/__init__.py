"""spark-amqp's compiled core (Rust): RabbitMQ stream chunks, and AMQP 0-9-1 content headers, to Arrow column buffers;
the sinks' rows to AMQP 1.0 messages and AMQP 0-9-1 content headers.

Not an API of its own: spark_amqp.stream_protocol.core picks it at import when its ``ABI`` is the one the connector
was written for, and falls back to the pure-Python path otherwise.
"""

from ._core import ABI, Builder, __version__, amqp10_records, basic_headers, basic_properties

__all__ = ["ABI", "Builder", "__version__", "amqp10_records", "basic_headers", "basic_properties"]
