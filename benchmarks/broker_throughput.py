"""Embedded broker vs real RabbitMQ, measured side by side with the same pika clients.

    python benchmarks/broker_throughput.py [--messages 100000] [--memory-messages 1000000]

Publishes ``--messages`` x 200-byte messages with pika (SelectConnection, 1000
outstanding confirms), then consumes them (prefetch 1000, multi-ack every 1000),
against the embedded broker running in its own process and, when
``AMQP_TEST_URL`` is set, against RabbitMQ. Prints msgs/s and the ratio. Then
fills one embedded queue with ``--memory-messages`` messages and reports the
broker's resident memory growth against the payload size (goal: <= 3x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika_baseline as pb

BODY = b"x" * 200


def measure(url: str, count: int, rounds: int) -> tuple[float, float]:
    pub, con = [], []
    for i in range(rounds):
        queue = f"bench.broker.{i}"
        pb.declare(url, queue)
        pub.append(count / pb.publish_async(url, queue, count, BODY, window=1000))
        con.append(count / pb.consume(url, queue, count, prefetch=1000, ack_every=1000))
        pb.declare(url, queue)
    return statistics.median(pub), statistics.median(con)


def memory(count: int) -> tuple[int, int]:
    with pb.embedded_broker_process() as (url, pid):
        pb.declare(url, "bench.memory")
        time.sleep(0.5)
        before = pb.rss_bytes(pid)
        pb.publish_async(url, "bench.memory", count, BODY, window=2000)
        after = pb.rss_bytes(pid)
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-messages", type=int, default=1_000_000)
    args = parser.parse_args()
    real = os.environ.get("AMQP_TEST_URL")
    print(f"{args.messages} x {len(BODY)} B, median of {args.rounds} rounds")
    with pb.embedded_broker_process() as (url, _):
        emb = measure(url, args.messages, args.rounds)
    print(f"embedded broker : publish {emb[0]:8.0f} msg/s   consume {emb[1]:8.0f} msg/s")
    if real:
        rmq = measure(real, args.messages, args.rounds)
        print(f"RabbitMQ        : publish {rmq[0]:8.0f} msg/s   consume {rmq[1]:8.0f} msg/s")
        print(f"ratio embedded/RabbitMQ: publish {emb[0] / rmq[0]:.2f}x   consume {emb[1] / rmq[1]:.2f}x   (goal >= 0.5x)")
    else:
        print("AMQP_TEST_URL not set: no RabbitMQ comparison")
    if args.memory_messages:
        before, after = memory(args.memory_messages)
        payload = args.memory_messages * len(BODY)
        growth = after - before
        print(
            f"memory: {args.memory_messages} queued messages grew the broker by {growth / 2**20:.0f} MiB "
            f"for {payload / 2**20:.0f} MiB of payload = {growth / payload:.2f}x (goal <= 3x)"
        )


if __name__ == "__main__":
    main()
