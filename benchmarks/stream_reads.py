"""Batch reads of a stream (``spark.read``), whole and filtered, against raw pika doing the same: part of
stream_throughput.py (issue 17).

- Batch read: every message of the benchmark's stream, from ``first`` to ``latest``, into Spark's
  ``noop`` sink, against raw pika reading them all (the run's own baseline).
- Filtered read: a stream of the same size whose messages carry ``x-stream-filter-value`` ``v0`` ..
  ``v9`` in blocks of ``FILTER_BLOCK`` (as several publishers, one per region, would write it: chunks
  hold one value or two), read with ``filter=v0`` (1 in 10). The baseline is raw pika with the same
  ``x-stream-filter`` checking each message's header as the source does, stopping at the last match.
"""

from __future__ import annotations

import time

import pika
import pika_baseline as pb

FILTER_VALUES = 10
FILTER_BLOCK = 5_000
BODY = b"x" * 200


def _value_index(i: int) -> int:
    return (i // FILTER_BLOCK) % FILTER_VALUES


def filter_value(i: int) -> str:
    return f"v{_value_index(i)}"


def preload_filtered(url: str, stream: str, count: int) -> float:
    """Seconds to publish ``count`` messages with their filter values (pika async, confirms)."""
    props = [pika.BasicProperties(headers={"x-stream-filter-value": f"v{v}"}) for v in range(FILTER_VALUES)]
    return pb.publish_async(url, stream, count, BODY, window=2000, properties=lambda i: props[_value_index(i)])


def matching(count: int) -> int:
    return sum(1 for i in range(count) if filter_value(i) == "v0")


def raw_filtered(url: str, stream: str, count: int, prefetch: int, ack_every: int) -> float:
    """msg/s (of the stream's messages: every offset counts) of raw pika reading the matches of ``v0``."""
    wanted = matching(count)

    def keep(props: pika.BasicProperties) -> bool:
        return (props.headers or {}).get("x-stream-filter-value") == "v0"

    seconds = pb.consume(url, stream, wanted, prefetch, ack_every, {"x-stream-offset": "first", "x-stream-filter": "v0"}, keep)
    return count / seconds


def spark_batch_read(spark, url: str, stream: str, partitions: int, expected: int, **options: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds of one spark.read of the stream (planning included), its rows counted by Spark."""
    reader = spark.read.format("amqp").option("uri", url).option("stream", stream).option("numPartitions", str(partitions))
    for key, value in options.items():
        reader = reader.option(key, value)
    start = time.perf_counter()
    rows = reader.load().count()
    seconds = time.perf_counter() - start
    if rows != expected:
        raise AssertionError(f"batch read of {stream} with {options}: {rows} rows, expected {expected}")
    return seconds
