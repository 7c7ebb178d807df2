"""The compiled core against the pure-Python path: CPU a message to make Arrow rows of stream chunks, without Spark,
for every column and for a query's ``.schema("body BINARY, offset BIGINT")`` (no property decoded).

    .venv/bin/python benchmarks/rows_core.py [--messages 200000] [--per-chunk 100] [--runs 5]

Producer-like messages, encoded with the connector's own AMQP 1.0 encoder: each its own message id, a correlation id,
a creation time, a subject, a content type, three application properties (a string, an AMQP int, a boolean) and a
~200-byte JSON body; in chunks of ``--per-chunk`` (RabbitMQ cuts chunks as writes arrive: PerfTest's made 27 messages
on average, range_over_protocol.py). Each path does what a stream-protocol task does with a chunk (streams/held.py,
range_over_protocol.py): the header read in Python, then either the core's ``Builder.add`` or ``chunks.records`` +
``RowMaker.row`` per record, and the rows taken as Arrow record batches every 10,000 (``read_range``'s batch). CPU is
this process's ``time.process_time``, the minimum of ``--runs`` runs; both paths must give equal tables first, and
the body + offset tables the full tables' two columns.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from spark_amqp import amqp10
from spark_amqp.amqp10.types import Opaque, Symbol, Timestamp
from spark_amqp.reading import arrow
from spark_amqp.reading.projection import Projection
from spark_amqp.stream_protocol import chunks, core
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from spark_amqp.streams.held import HeldRows

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BATCH_ROWS = 10_000
# The columns measured: every one (no .schema()), and body + offset.
COLUMNS: dict[str, Projection | None] = {
    "all columns": None,
    "body + offset": Projection("stream", ("body", "offset"), ("body", "offset"), (False, False)),
}
_INT = struct.Struct(">i")


def order_body(i: int) -> bytes:
    """Message ``i``'s ~200-byte JSON body (properties_core.py's too)."""
    return json.dumps(
        {
            "order": f"ord-{i:010d}",
            "customer": f"cust-{i * 7919 % 100_000:06d}",
            "amount": round(i * 1.37 % 1000, 2),
            "currency": "EUR",
            "items": [{"sku": f"sku-{i % 977:04d}", "qty": i % 5 + 1}],
            "note": "producer-like payload " + "x" * (48 + i % 17),
        },
        separators=(",", ":"),
    ).encode()


def message(i: int) -> bytes:
    body = order_body(i)
    properties: list[object] = [None] * 13
    properties[0] = f"msg-{i:012d}-{i * 2654435761 % 2**32:08x}"  # message-id
    properties[3] = "orders.created" if i % 3 else "orders.updated"  # subject
    properties[5] = f"corr-{i // 4:010d}"  # correlation-id
    properties[6] = Symbol("application/json")  # content-type
    properties[9] = Timestamp(BASE_MS + i * 37)  # creation-time
    apps = {"tenant": f"tenant-{i % 13}", "attempt": Opaque(0x71, _INT.pack(i % 1000 - 3)), "priority_customer": i % 2 == 0}
    return amqp10.encode(body, properties=properties, application_properties=apps)


def make_chunks(n: int, per_chunk: int) -> list[bytes]:
    return [chunks.build(f, [message(i) for i in range(f, min(n, f + per_chunk))], BASE_MS + f) for f in range(0, n, per_chunk)]


def read(all_chunks: list[bytes], use_core: bool, columns: Projection | None = None) -> list[pa.RecordBatch]:
    """The batches a task would yield: each chunk whole (skip 0, the chunk's records), taken every BATCH_ROWS rows."""
    conversion = Conversion.of((4, 3))
    made = None if columns is None else columns.made(False)
    maker = RowMaker("orders", conversion, made)
    held = HeldRows(columns)
    held.use(core.builder("orders", conversion, None, False, made) if use_core else None)
    out: list[pa.RecordBatch] = []
    for data in all_chunks:
        view = memoryview(data)
        header = chunks.read_header(view)
        if not held.add_chunk(view, 0, header.records):
            first = header.first_offset
            held.extend([maker.row(r, first + i) for i, r in enumerate(chunks.records(view, header))])
        if len(held) >= BATCH_ROWS:
            out += held.take()
    return out + held.take()


def cpu(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--per-chunk", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if core.CORE is None:
        sys.exit(f"no compiled core to measure: {core.PATH} (make install builds it)")
    all_chunks = make_chunks(args.messages, args.per_chunk)
    size = sum(map(len, all_chunks)) / args.messages
    full = None
    for columns in COLUMNS.values():
        schema = arrow.STREAM_ARROW_SCHEMA if columns is None else columns.schema
        python = pa.Table.from_batches(read(all_chunks, False, columns), schema=schema)
        compiled = pa.Table.from_batches(read(all_chunks, True, columns), schema=schema)
        assert python.num_rows == compiled.num_rows == args.messages and python.equals(compiled), "the paths' tables differ"
        full = full or python
        assert columns is None or python.equals(full.select(list(columns.names))), "some columns differ from the full read's"
    print(f"{args.messages:,} messages, {size:.0f} bytes each in chunks of {args.per_chunk}; rows: {core.PATH}; tables equal")
    results = {}
    for label, columns in COLUMNS.items():
        print(f" {label}:")
        for name, use_core in (("pure Python", False), ("compiled core", True)):
            times = cpu(lambda use_core=use_core, columns=columns: read(all_chunks, use_core, columns), args.runs)
            results[label, name] = min(times) / args.messages * 1e6
            runs = ", ".join(f"{t / args.messages * 1e6:.2f}" for t in times)
            print(f"  {name:14} {results[label, name]:7.2f} us of CPU a message (min of {args.runs}: {runs})")
        print(f"  the core: {results[label, 'pure Python'] / results[label, 'compiled core']:.1f}x less CPU a message")
    for name in ("pure Python", "compiled core"):
        saved = results["all columns", name] / results["body + offset", name]
        print(f" {name}: body + offset takes {saved:.1f}x less CPU than all columns")


if __name__ == "__main__":
    main()
