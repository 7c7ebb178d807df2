"""The stream sink writing a super stream on a RabbitMQ cluster: one connection per partition leader against
one connection through any node, side by side in the same run.

    python benchmarks/cluster_sink.py --stream-url rabbitmq-stream://guest:guest@127.0.0.1:5711,127.0.0.1:5712,127.0.0.1:5713/%2F

Declares a super stream of ``--partitions`` partition streams whose leaders are spread over the cluster's
nodes (each declared through a different node, leader locator client-local), then publishes ``--rows``
200-byte rows from one sink partition (``StreamPartitionPublisher``, deduplication on, no Spark: only the
publishing is timed), ``--rounds`` times in each mode, alternating: as the sink does (a connection to each
partition's leader) and with ``loadBalancer=true`` (every partition through the one node reached, which
forwards what it does not lead). A rate counts only if every row was confirmed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
import uuid

import pyarrow as pa

from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.stream_protocol.client import StreamClient


async def _partition_streams(url: str, names: list[str], delete: bool = False) -> None:
    """Creates (or deletes) each stream through another node of the uri: created there, it is led there."""
    opts = parse_sink_options({"uri": url, "superStream": "x"}).connection
    hosts = opts.endpoints
    for i, name in enumerate(names):
        node = hosts[i % len(hosts)]
        client = await StreamClient.connect(dataclasses.replace(opts, endpoints=(node,)), "bench cluster sink")
        try:
            if delete:
                await client.delete(name)
            else:
                await client.create(name, {"queue-leader-locator": "client-local"})
        finally:
            await client.close()


def _rate(url: str, super_stream: str, rows: int, **extra: str) -> float:
    keys = [f"k{i}" for i in range(rows)]
    batches = [
        pa.RecordBatch.from_pydict({"body": [b"x" * 200] * len(keys[k : k + 10_000]), "partition_key": keys[k : k + 10_000]})
        for k in range(0, rows, 10_000)
    ]
    opts = parse_sink_options({"uri": url, "superStream": super_stream, **extra})
    started = time.perf_counter()
    done = asyncio.run(StreamPartitionPublisher(opts, producer_for(f"bench-{uuid.uuid4().hex}", 0, 0)).publish(batches))
    elapsed = time.perf_counter() - started
    assert done.confirmed == rows, done
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream-url", required=True, help="the cluster's rabbitmq-stream:// uri, every node listed")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assert len(parse_sink_options({"uri": args.stream_url, "superStream": "x"}).connection.endpoints) > 1, "list every node in --stream-url"
    name = f"bench-super-{uuid.uuid4().hex[:8]}"
    partitions = [f"{name}-{i}" for i in range(args.partitions)]
    asyncio.run(_partition_streams(args.stream_url, partitions))
    leaders: list[float] = []
    one: list[float] = []
    try:
        for r in range(args.rounds):
            leaders.append(_rate(args.stream_url, name, args.rows))
            one.append(_rate(args.stream_url, name, args.rows, loadBalancer="true"))
            print(f"round {r + 1}: a connection per leader {leaders[-1]:,.0f} msg/s, one connection {one[-1]:,.0f} msg/s")
    finally:
        asyncio.run(_partition_streams(args.stream_url, partitions, delete=True))
    lead, single = statistics.mean(leaders), statistics.mean(one)
    print(f"\n{args.rows:,} rows x 200 B into {args.partitions} partitions, {args.rounds} rounds (means):")
    print(f"  a connection per partition leader (the sink) {lead:,.0f} msg/s = {lead / single:.2f}x")
    print(f"  one connection through any node               {single:,.0f} msg/s (baseline)")


if __name__ == "__main__":
    main()
