"""The compiled core against the pure-Python path for AMQP 0-9-1 deliveries: CPU a message of ``arrow.to_record_batch``
(the queue source's batch, every column), without Spark or a broker.

    .venv/bin/python benchmarks/properties_core.py [--messages 100000] [--batch 10000] [--runs 5]

Producer-like deliveries, their content headers encoded by pamqp as a publisher's client would: each its own
message_id, correlation_id, timestamp, type, app_id, content_type and a 3-entry headers table (a string, an int, a
boolean), a ~200-byte JSON body; in batches of ``--batch`` rows (the runtime plans one batch per trigger). Each run
gets fresh ``LazyProperties`` of the same header bytes (a decoded message keeps its values), made outside the clock.
CPU is this process's ``time.process_time`` around ``to_record_batch``, the minimum of ``--runs`` runs; both paths'
tables must be equal first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
from pamqp import commands, header
from rows_core import order_body  # benchmarks/, the script's own directory, is first on sys.path

from spark_amqp.client.properties import LazyProperties
from spark_amqp.reading import arrow
from spark_amqp.stream_protocol import core

BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def delivery(i: int) -> tuple[bytes, bytes]:
    """(content header, body) of message ``i``."""
    body = order_body(i)
    props = commands.Basic.Properties(
        message_id=f"msg-{i:012d}-{i * 2654435761 % 2**32:08x}",
        correlation_id=f"corr-{i // 4:010d}",
        timestamp=BASE + datetime.timedelta(seconds=i),
        message_type="orders.created" if i % 3 else "orders.updated",
        app_id="shop",
        content_type="application/json",
        headers={"tenant": f"tenant-{i % 13}", "attempt": i % 1000 - 3, "priority_customer": i % 2 == 0},
    )
    return header.ContentHeader(0, len(body), props).marshal(), body


def batches(deliveries: list[tuple[bytes, bytes]], size: int) -> list[list[tuple[str, str, int, bool, str, str, LazyProperties, bytes]]]:
    rows = [("s.1", "orders", i + 1, False, "shop", "orders.created", LazyProperties(h), b) for i, (h, b) in enumerate(deliveries)]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def read(deliveries: list[tuple[bytes, bytes]], size: int, use_core: bool) -> tuple[float, pa.Table]:
    """CPU of to_record_batch over every batch, and the table made."""
    todo = batches(deliveries, size)
    saved = core.CORE
    core.CORE = saved if use_core else None
    try:
        start = time.process_time()
        made = [arrow.to_record_batch(b) for b in todo]
        spent = time.process_time() - start
    finally:
        core.CORE = saved
    return spent, pa.Table.from_batches(made, schema=arrow.ARROW_SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if core.CORE is None:
        sys.exit(f"no compiled core to measure: {core.PATH} (make install builds it)")
    deliveries = [delivery(i) for i in range(args.messages)]
    _, python = read(deliveries, args.batch, False)
    _, compiled = read(deliveries, args.batch, True)
    assert python.num_rows == compiled.num_rows == args.messages and python.equals(compiled), "the paths' tables differ"
    size = sum(len(h) - 12 for h, _ in deliveries) / args.messages
    print(f"{args.messages:,} deliveries, {size:.0f} bytes of properties each, batches of {args.batch:,}; {core.PATH}; tables equal")
    results = {}
    for name, use_core in (("pure Python", False), ("compiled core", True)):
        times = [read(deliveries, args.batch, use_core)[0] for _ in range(args.runs)]
        results[name] = min(times) / args.messages * 1e6
        runs = ", ".join(f"{t / args.messages * 1e6:.2f}" for t in times)
        print(f" {name:14} {results[name]:6.2f} us of CPU a message (min of {args.runs}: {runs})")
    print(f" the core: {results['pure Python'] / results['compiled core']:.1f}x less CPU a message")


if __name__ == "__main__":
    main()
