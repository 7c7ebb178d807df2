"""RabbitMQ's names and limits that several parts of the package follow: the sink, both reading modes, and the
embedded broker, which answers as RabbitMQ does. One definition each; this module imports nothing of the package."""

from __future__ import annotations

__all__ = [
    "EXCHANGE_TYPES",
    "FILTER_VALUE_HEADER",
    "MAX_MESSAGE_SIZE_3X",
    "MAX_MESSAGE_SIZE_4X",
    "MAX_PARTITIONS",
    "MAX_PREFETCH",
    "partition_name",
]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")

# The default max_message_size: 128 MiB up to 3.x, 16 MiB from 4.0 (a larger body closes the channel, 406).
MAX_MESSAGE_SIZE_3X = 134_217_728
MAX_MESSAGE_SIZE_4X = 16_777_216

MAX_PREFETCH = 65535  # basic.qos prefetch_count is a 16-bit field

# A message's value for stream filtering (RabbitMQ 3.13+): an AMQP 0-9-1 header, or the stream protocol's
# publish v2 filter value; each chunk keeps a Bloom filter of them.
FILTER_VALUE_HEADER = "x-stream-filter-value"

# How far a scan for a super stream's partitions NAME-0, NAME-1, ... goes at most (RabbitMQ's own default
# max_super_stream_partitions is 1000).
MAX_PARTITIONS = 10_000


def partition_name(super_stream: str, n: int) -> str:
    """The n-th partition stream of a super stream, as RabbitMQ's tools and clients create them."""
    return f"{super_stream}-{n}"
