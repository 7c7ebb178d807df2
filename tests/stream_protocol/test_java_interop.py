"""Compressed sub-entries against a client nobody here wrote: RabbitMQ's Java stream client (tests/java/StreamInterop.java,
built by ``make streamclient``) writes each codec and the connector reads it over the stream protocol; the connector's
sink writes each codec and the Java client reads it. On every real node and the embedded broker."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_publisher import StreamPartitionPublisher
from spark_amqp.stream_protocol.compression import CODECS
from spark_amqp.streams.batch import StreamBatchReader
from spark_amqp.streams.options import parse_stream_options

ROOT = Path(__file__).resolve().parents[2]
JARS = ROOT / ".cache" / "stream-client"
N = 1_000
Node = tuple[str, str, str]

pytestmark = pytest.mark.skipif(
    not (JARS / "classes" / "StreamInterop.class").exists() or shutil.which("java") is None,
    reason="RabbitMQ's Java stream client is not built: make streamclient (make test builds it)",
)


def _java(*args: str) -> str:
    done = subprocess.run(["java", "-cp", f"{JARS}/*:{JARS}/classes", "StreamInterop", *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _bodies() -> list[bytes]:
    return [b"m-%d" % i for i in range(N)]


@pytest.mark.parametrize("codec", list(CODECS.values()))
def test_the_connector_reads_what_the_java_client_compressed(stream_node: Node, created_stream: str, codec: str) -> None:
    assert _java("write", stream_node[1], created_stream, codec, str(N)) == f"written {N}"
    reader = StreamBatchReader(parse_stream_options({"uri": stream_node[1], "stream": created_stream, "connectionTimeout": "20"}))
    rows = [
        (o, b)
        for p in reader.partitions()
        for batch in reader.read(p)
        for o, b in zip(batch.column("offset").to_pylist(), batch.column("body").to_pylist(), strict=True)
    ]
    assert rows == list(enumerate(_bodies()))


@pytest.mark.parametrize("codec", list(CODECS.values()))
def test_the_java_client_reads_what_the_connector_compressed(stream_node: Node, created_stream: str, codec: str) -> None:
    options = parse_sink_options({"uri": stream_node[1], "stream": created_stream, "subEntrySize": "100", "compression": codec})
    publisher = StreamPartitionPublisher(options, producer_for("interop-" + uuid.uuid4().hex, 0, None))
    assert asyncio.run(publisher.publish([pa.RecordBatch.from_pydict({"body": _bodies()})])).confirmed == N
    crc = zlib.crc32(b"".join(b + b"\n" for b in _bodies()))
    assert _java("read", stream_node[1], created_stream, str(N)) == f"read {N} crc {crc} misplaced 0"
