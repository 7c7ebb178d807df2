"""Both paths of the stream protocol's rows give identical Arrow data on messages every client the project tests with
wrote: pika (AMQP 0-9-1 into a stream), the connector's stream-protocol sink (plain and compressed sub-entries) and
AMQP 1.0 sink, python-qpid-proton (AMQP 1.0, RabbitMQ 4.x), RabbitMQ's Java stream client (tests/java/StreamInterop.java,
``make streamclient``) and PerfTest (``make perftest``). Each stream is read back over the stream protocol with
``read_range`` as a task reads it, once with the compiled core and once on the pure-Python path, on the embedded broker
and every node in AMQP_TEST_STREAM_BROKERS; the tables must be equal, schema included, and the core must have taken the
chunks a writer sends whole (not left them all to Python, which would make the comparison empty)."""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import subprocess
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pyarrow as pa
import pytest

from spark_amqp import amqp10
from spark_amqp.errors import AmqpSourceError
from spark_amqp.reading import arrow
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.amqp10_publisher import Amqp10PartitionPublisher
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.stream_protocol import core
from spark_amqp.streams import held
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.range_reader import read_range
from spark_amqp.streams.ranges import StreamRange
from tests.brokers import version_of

from .helpers import publish, run

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

ROOT = Path(__file__).resolve().parents[2]
STREAM_CLIENT = ROOT / ".cache" / "stream-client"
PERFTEST = ROOT / ".cache" / "perftest"
N = 300
WHEN = datetime.datetime(2026, 1, 1, 0, 0, 0, tzinfo=datetime.UTC)
Node = tuple[str, str, str]


def _json(i: int) -> bytes:
    note = "producer-like payload " + "x" * (48 + i % 17)
    return json.dumps({"order": f"ord-{i:010d}", "amount": round(i * 1.37 % 1000, 2), "currency": "EUR", "note": note}).encode()


def _headers(i: int) -> dict[str, Any]:
    return {"tenant": f"tenant-{i % 13}", "attempt": i % 1000 - 3, "priority_customer": i % 2 == 0, "x-stream-filter-value": f"t{i % 3}"}


def by_pika(node: Node, stream: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(node[2]))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(N):
        props = pika.BasicProperties(
            message_id=f"msg-{i:012d}",
            correlation_id=f"corr-{i // 4}",
            content_type="application/json",
            timestamp=int(WHEN.timestamp()) + i,
            type="order" if i % 2 else None,
            app_id="shop",
            delivery_mode=2 if i % 5 else 1,
            priority=i % 10 if i % 7 else None,
            headers={**_headers(i), "when": WHEN, "raw": b"\x00\xff", "none": None} if i % 11 else None,
        )
        ch.basic_publish("", stream, _json(i), props)
    conn.close()
    return N


def _table(n: int) -> pa.RecordBatch:
    headers = [[(k, str(v)) for k, v in _headers(i).items()] for i in range(n)]
    return pa.RecordBatch.from_pydict(
        {
            "body": [_json(i) for i in range(n)],
            "message_id": [f"msg-{i:012d}" for i in range(n)],
            "correlation_id": [f"corr-{i // 4}" for i in range(n)],
            "content_type": ["application/json"] * n,
            "timestamp": [WHEN + datetime.timedelta(seconds=i) for i in range(n)],
            "headers": pa.array(headers, pa.map_(pa.string(), pa.string())),
        }
    )


def by_stream_sink(node: Node, stream: str, **extra: str) -> int:
    options = parse_sink_options({"uri": node[1], "stream": stream, **extra})
    publisher = StreamPartitionPublisher(options, producer_for("parity-" + uuid.uuid4().hex, 0, None))
    assert asyncio.run(publisher.publish([_table(N)])).confirmed == N
    return N


def by_compressing_stream_sink(node: Node, stream: str) -> int:
    return by_stream_sink(node, stream, subEntrySize="50", compression="zstd")


def _amqp10_broker(node: Node) -> None:
    if node[0] != "embedded" and version_of(node[2]) < (4, 0):
        pytest.skip("AMQP 1.0 is RabbitMQ 4.x's")


def by_amqp10_sink(node: Node, stream: str) -> int:
    _amqp10_broker(node)
    options = parse_sink_options({"uri": node[2], "protocol": "amqp1.0", "routingKey": stream})
    result = asyncio.run(Amqp10PartitionPublisher(options, Amqp10MessageBuilder(options)).publish([_table(N)], "parity"))
    assert result.confirmed == N
    return N


def by_proton(node: Node, stream: str) -> int:
    _amqp10_broker(node)
    proton = pytest.importorskip("proton", reason="python-qpid-proton is not installed (make install puts it into .venv)")
    from proton.utils import BlockingConnection

    parts = urllib.parse.urlsplit(node[2])
    conn = BlockingConnection(f"{parts.hostname}:{parts.port}", allowed_mechs="PLAIN", user=parts.username, password=parts.password)
    try:
        sender = conn.create_sender(f"/queues/{stream}")
        for i in range(N):
            message = proton.Message(
                body=_json(i),
                id=f"msg-{i:012d}",
                correlation_id=f"corr-{i // 4}",
                subject="orders.created",
                content_type=proton.symbol("application/json"),
                creation_time=WHEN.timestamp() + i,
                durable=bool(i % 2),
                properties={**_headers(i), "d": 1.5, "t": proton.timestamp(1_767_225_600_000 + i)},
            )
            sender.send(message)
    finally:
        conn.close()
    return N


def _java(*args: str) -> str:
    if not (STREAM_CLIENT / "classes" / "StreamInterop.class").exists() or shutil.which("java") is None:
        pytest.skip("RabbitMQ's Java stream client is not built: make streamclient (make test builds it)")
    cp = f"{STREAM_CLIENT}/*:{STREAM_CLIENT}/classes"
    done = subprocess.run(["java", "-cp", cp, "StreamInterop", *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def by_java(node: Node, stream: str) -> int:
    assert _java("write", node[1], stream, "producer", str(N)) == f"written {N}"
    return N


def by_java_compressed(node: Node, stream: str) -> int:
    assert _java("write", node[1], stream, "lz4", str(N)) == f"written {N}"
    return N


def by_perftest(node: Node, stream: str) -> int:
    if not PERFTEST.is_dir() or shutil.which("java") is None:
        pytest.skip("PerfTest is not fetched: make perftest (make test fetches it)")
    # As benchmarks/stream_throughput.py preloads a stream: one producer, 200-byte bodies, confirmed, into the
    # predeclared stream; PerfTest's own message properties (a timestamp in the body, none of its own otherwise).
    args = ["--uri", node[2], "--predeclared", "--queue", stream, "--producers", "1", "--consumers", "0"]
    args += ["--pmessages", str(N), "--size", "200", "--confirm", "100", "--flag", "persistent"]
    done = subprocess.run(
        ["java", "-cp", f"{PERFTEST}/*", "com.rabbitmq.perf.PerfTest", *args], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return N


# The writers, and whether the core takes what they write (compressed sub-entries are Python's).
WRITERS: dict[str, tuple[Callable[[Node, str], int], bool]] = {
    "pika": (by_pika, True),
    "stream-sink": (by_stream_sink, True),
    "stream-sink-zstd": (by_compressing_stream_sink, False),
    "amqp10-sink": (by_amqp10_sink, True),
    "proton": (by_proton, True),
    "java-stream-client": (by_java, True),
    "java-stream-client-lz4": (by_java_compressed, False),
    "perftest": (by_perftest, True),
}


def read(stream_url: str, stream: str, end: int, **extra: str) -> pa.Table:
    opts = parse_stream_options({"uri": stream_url, "stream": stream, "connectionTimeout": "20", **extra})
    batches = list(read_range(opts, StreamRange(stream, 0, end), 100))  # small batches: core and Python rows meet
    for b in batches:
        b.validate(full=True)
    return pa.Table.from_batches(batches, schema=arrow.STREAM_ARROW_SCHEMA)


@pytest.mark.parametrize("writer", list(WRITERS))
def test_both_paths_read_what_each_client_wrote_alike(
    stream_node: Node, created_stream: str, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, whole = WRITERS[writer]
    if stream_node[0] != "embedded" and version_of(stream_node[2]) < (4, 0):
        whole = False  # RabbitMQ 3.x's conversion is Python's alone: the comparison shows the core stood aside
    n = write(stream_node, created_stream)
    taken: list[bool] = []
    add_chunk = held.HeldRows.add_chunk

    def counted(self: held.HeldRows, chunk: memoryview, skip: int, stop: int) -> bool:
        taken.append(add_chunk(self, chunk, skip, stop))
        return taken[-1]

    monkeypatch.setattr(held.HeldRows, "add_chunk", counted)
    with_core = read(stream_node[1], created_stream, n)
    filtered = None
    # The filter's values as pika's messages carry them (the header the broker's Bloom filter reads over AMQP 0-9-1).
    if writer == "pika" and (stream_node[0] == "embedded" or version_of(stream_node[2]) >= (3, 13)):
        filtered = read(stream_node[1], created_stream, n, filter="t1,t2")
    assert taken and all(taken) if whole else not any(taken), taken
    monkeypatch.setattr(core, "CORE", None)
    python = read(stream_node[1], created_stream, n)
    assert with_core.num_rows == n
    assert with_core.equals(python), _first_difference(with_core, python)
    if filtered is not None:
        python_filtered = read(stream_node[1], created_stream, n, filter="t1,t2")
        assert filtered.equals(python_filtered), _first_difference(filtered, python_filtered)


def _first_difference(a: pa.Table, b: pa.Table) -> str:
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if x != y:
            i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            return f"column {name}, row {i}: core {x[i] if i < len(x) else None!r}, Python {y[i] if i < len(y) else None!r}"
    return f"schemas: {a.schema} / {b.schema}"


def test_a_malformed_message_fails_the_read_alike_on_both_paths(
    stream_node: Node, created_stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message whose properties run past its end: the core leaves its chunk to Python, which fails the task with the
    error it always gave, naming the stream and the broker; the worker is not harmed, and nothing is read past."""
    good = amqp10.encode(b"ok", properties=["id-0"])
    bad = b"\x00\x53\x73\xc0\x05\x01\xa1\x10ab"  # a list of one string of 16 bytes, 2 of which came
    run(stream_node[1], lambda c: publish(c, created_stream, [good, bad, good]))
    said = []
    for path in ("core", "python"):
        if path == "python":
            monkeypatch.setattr(core, "CORE", None)
        with pytest.raises(AmqpSourceError) as info:
            read(stream_node[1], created_stream, 3)
        said.append(str(info.value))
    assert said[0] == said[1] and f"stream '{created_stream}'" in said[0] and "runs past the end" in said[0], said
