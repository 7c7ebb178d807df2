"""Stream reads over AMQP 1.0 without Spark: the CPU a message costs the reader (its link, its rows, their Arrow
batches), with the compiled core making each message's row and on the pure-Python path, for both message shapes.

    AMQP_TEST_URL=$(tools/rabbitmq url 4.3) .venv/bin/python benchmarks/amqp10_stream_rows.py \\
      --stream-url $(tools/rabbitmq stream-url 4.3) --messages 100000 --rounds 3

Each shape's messages go into a stream of their own, written by the connector's stream publisher; each round reads
the whole stream once on each path (alternating which goes first), in this process, and prints the process CPU a
message (``time.process_time``) and the wall-clock rate. RabbitMQ 4.x (AMQP 1.0 reads streams there).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shapes
from stream_throughput import declare_stream, delete_queue

from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.stream_protocol import core
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange


def preload(stream_url: str, stream: str, shape: str, count: int) -> None:
    opts = parse_sink_options({"uri": stream_url, "stream": stream})
    producer = producer_for("bench-" + uuid.uuid4().hex, 0, None)
    asyncio.run(StreamPartitionPublisher(opts, producer).publish(shapes.arrow_batches(shape, count)))


def read(url: str, stream: str, count: int, compiled: bool) -> tuple[float, float]:
    """(CPU µs a message, msg/s) of reading the whole stream over AMQP 1.0 on one path."""
    saved = core.CORE
    if not compiled:
        core.CORE = None
    try:
        opts = parse_stream_options({"uri": url, "stream": stream, "protocol": "amqp1.0", "connectionTimeout": "20"})
        cpu, wall = time.process_time(), time.perf_counter()
        rows = sum(b.num_rows for b in read_range(opts, StreamRange(stream, 0, count), 20_000))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        core.CORE = saved
    if rows != count:
        raise RuntimeError(f"read {rows} rows of {count}")
    return cpu / count * 1e6, count / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("AMQP_TEST_URL", "amqp://guest:guest@127.0.0.1:5690/%2F"))
    parser.add_argument("--stream-url", default=os.environ.get("AMQP_TEST_STREAM_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5570/%2F"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if core.CORE is None:
        raise SystemExit(f"no compiled core to compare: {core.PATH}")
    print(f"{args.messages:,} messages a stream, read over AMQP 1.0 ({core.PATH}); load {os.getloadavg()[0]:.2f}")
    for shape in shapes.SHAPES:
        stream = f"bench-amqp10-rows-{shape}"
        declare_stream(args.url, stream)  # afresh: pika_baseline.declare deletes it first
        preload(args.stream_url, stream, shape, args.messages)
        read(args.url, stream, args.messages, True)  # warm-up: imports, the first connection
        results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.rounds):
            for compiled in (True, False) if r % 2 == 0 else (False, True):
                results[compiled].append(read(args.url, stream, args.messages, compiled))
        for compiled in (True, False):
            cpu = statistics.median(c for c, _ in results[compiled])
            rate = statistics.median(w for _, w in results[compiled])
            path = "compiled core" if compiled else "pure Python  "
            print(f"  {shape:13s} {path}: {cpu:6.1f} us of CPU a message, {rate:9,.0f} msg/s (medians of {args.rounds})")
        delete_queue(args.url, stream)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
