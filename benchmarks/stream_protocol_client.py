"""The stream-protocol client alone (issue 18's choice of client): spark-amqp's own against rstream, side by side.

Usage: python benchmarks/stream_protocol_client.py rabbitmq-stream://guest:guest@127.0.0.1:5570/%2F [messages]

In one run, on one stream of ``messages`` x 200 B written as RabbitMQ writes an AMQP 0-9-1
publish (x-exchange / x-routing-key annotations, then the body):

- publish with confirms: ours with deduplication on (a producer name, ids from 1), 500 messages
  a frame and at most 20,000 unconfirmed, against rstream's ``send_batch`` of 500 (no name);
- read from ``first``: ours to records (chunks cut, CRC checked), ours to the source's Arrow
  rows (``RowMaker`` + ``arrow.to_stream_batch`` every 10,000), rstream raw (bytes), rstream
  with its AMQP 1.0 decoder.

No Spark: this measures what a task's reader and writer are built on.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.parse
from typing import Any

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Symbol
from spark_amqp.option_reader import OptionReader
from spark_amqp.reading import arrow
from spark_amqp.stream_protocol import chunks
from spark_amqp.stream_protocol.client import OffsetSpec, StreamClient
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from spark_amqp.transport.options import parse_connection

STREAM = "bench-stream-protocol"
BATCH = 500
WINDOW = 20_000


def message() -> bytes:
    return amqp10.encode(b"x" * 200, annotations={Symbol("x-exchange"): "", Symbol("x-routing-key"): STREAM})


async def ours_publish(options: Any, n: int) -> float:
    client = await StreamClient.connect(options, "bench publisher")
    try:
        try:
            await client.delete(STREAM)
        except Exception as err:  # absent: nothing to delete
            print(f"(no stream to delete: {err})")
        await client.create(STREAM)
        confirmed = [0]
        await client.declare_publisher(1, "bench-producer", STREAM, lambda ids: confirmed.__setitem__(0, confirmed[0] + len(ids)), print)
        body = message()
        start = time.perf_counter()
        next_id = 1
        while next_id <= n:
            while next_id - 1 - confirmed[0] > WINDOW:
                await asyncio.sleep(0.001)
            batch = [(next_id + i, body) for i in range(min(BATCH, n - next_id + 1))]
            client.publish(1, batch)
            next_id += len(batch)
            await asyncio.sleep(0)
        while confirmed[0] < n:
            await asyncio.sleep(0.001)
        return n / (time.perf_counter() - start)
    finally:
        await client.close()


async def ours_read(options: Any, n: int, rows: bool, stream: str = STREAM) -> float:
    """msg/s reading the first ``n`` messages of ``stream`` from ``first``: to records, or on to the source's Arrow rows."""
    client = await StreamClient.connect(options, "bench reader")
    maker = RowMaker(stream, Conversion.of(client.server_version))
    done = asyncio.Event()
    count = [0]
    pending: list[Any] = []

    def on_chunk(view: memoryview) -> None:
        header = chunks.read_header(view)
        records = chunks.records(view, header)
        if rows:
            pending.extend(maker.row(r, header.first_offset + i) for i, r in enumerate(records))
            if len(pending) >= 10_000 or count[0] + len(records) >= n:
                arrow.to_stream_batch(pending)
                pending.clear()
        count[0] += len(records)
        client.credit(1, 1)
        if count[0] >= n:
            done.set()

    try:
        start = time.perf_counter()
        await client.subscribe(1, stream, OffsetSpec.FIRST, 10, on_chunk)
        await done.wait()
        return n / (time.perf_counter() - start)
    finally:
        await client.close()


async def rstream_publish(host: str, port: int, user: str, password: str, n: int) -> float:
    from rstream import AMQPMessage, Producer

    async with Producer(host, port=port, username=user, password=password, load_balancer_mode=False) as producer:
        name = STREAM + "-rstream"
        await producer.delete_stream(name, missing_ok=True)
        await producer.create_stream(name)
        confirmed = [0]

        async def on_confirm(_: Any) -> None:
            confirmed[0] += 1

        start = time.perf_counter()
        for _ in range(0, n, BATCH):
            await producer.send_batch(name, [AMQPMessage(body=b"x" * 200) for _ in range(BATCH)], on_publish_confirm=on_confirm)
        while confirmed[0] < n:
            await asyncio.sleep(0.001)
        rate = n / (time.perf_counter() - start)
        await producer.delete_stream(name)
        return rate


async def rstream_read(host: str, port: int, user: str, password: str, n: int, decode: bool, stream: str = STREAM) -> float:
    """msg/s of rstream reading the first ``n`` messages of ``stream`` from ``first``: raw bytes, or AMQP 1.0 decoded."""
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    done = asyncio.Event()
    count = [0]
    async with Consumer(host, port=port, username=user, password=password, load_balancer_mode=False) as consumer:

        async def on_message(_: Any, __: Any) -> None:
            count[0] += 1
            if count[0] >= n:
                done.set()

        start = time.perf_counter()
        extra: dict[str, Any] = {"decoder": amqp_decoder} if decode else {}
        await consumer.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None), **extra)
        await done.wait()
        return n / (time.perf_counter() - start)


def connection(uri: str) -> Any:
    """``StreamClient.connect``'s options for a rabbitmq-stream:// uri."""
    return parse_connection(
        OptionReader({"uri": uri, "connectionTimeout": "60"}, {"uri": "uri", "connectiontimeout": "connectionTimeout"}), True
    )


def rstream_login(uri: str) -> tuple[str, int, str, str]:
    """(host, port, user, password) of a rabbitmq-stream:// uri, as rstream takes them."""
    parts = urllib.parse.urlsplit(uri.replace("rabbitmq-stream", "amqp", 1))
    return (
        parts.hostname or "127.0.0.1",
        parts.port or 5552,
        urllib.parse.unquote(parts.username or "guest"),
        urllib.parse.unquote(parts.password or "guest"),
    )


def main() -> None:
    uri = sys.argv[1] if len(sys.argv) > 1 else "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000
    options = connection(uri)
    login = rstream_login(uri)
    results = {
        "publish, spark-amqp with dedup": asyncio.run(ours_publish(options, n)),
        "publish, rstream": asyncio.run(rstream_publish(*login, n)),
        "read, spark-amqp to records": asyncio.run(ours_read(options, n, rows=False)),
        "read, spark-amqp to Arrow rows": asyncio.run(ours_read(options, n, rows=True)),
        "read, rstream raw": asyncio.run(rstream_read(*login, n, decode=False)),
        "read, rstream AMQP 1.0 decoded": asyncio.run(rstream_read(*login, n, decode=True)),
    }
    print(f"{n:,} messages of 200 B, {options.display_uri}")
    for name, rate in results.items():
        print(f"  {name:34s} {rate:12,.0f} msg/s")
    print(f"  publish: ours / rstream = {results['publish, spark-amqp with dedup'] / results['publish, rstream']:.2f}x")
    print(
        f"  read rows: ours / rstream decoded = {results['read, spark-amqp to Arrow rows'] / results['read, rstream AMQP 1.0 decoded']:.2f}x"
    )


if __name__ == "__main__":
    main()
