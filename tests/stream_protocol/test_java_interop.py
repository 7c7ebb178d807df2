"""Compressed sub-entries against a client nobody here wrote: RabbitMQ's Java stream client (tests/java/StreamInterop.java,
built by ``make streamclient``) writes each codec and the connector reads it over the stream protocol; the connector's
sink writes each codec and the Java client reads it. On every real node and the embedded broker."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _java(*args: str) -> list[str]:
    """What StreamInterop printed, a line per stream: one JVM serves every codec (each start costs seconds of CPU)."""
    done = subprocess.run(["java", "-cp", f"{JARS}/*:{JARS}/classes", "StreamInterop", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def _bodies() -> list[bytes]:
    return [b"m-%d" % i for i in range(N)]


@pytest.fixture
def codec_streams(stream_node: Node) -> Iterator[dict[str, str]]:
    """A fresh stream for each codec, deleted after the test."""
    from .helpers import run

    streams = {codec: f"sp-{uuid.uuid4().hex[:10]}-{codec}" for codec in CODECS.values()}

    async def create(client: Any) -> None:
        for name in streams.values():
            await client.create(name, {})

    async def delete(client: Any) -> None:
        for name in streams.values():
            await client.delete(name)

    run(stream_node[1], create)
    yield streams
    run(stream_node[1], delete)


def test_the_connector_reads_what_the_java_client_compressed(stream_node: Node, codec_streams: dict[str, str]) -> None:
    names = list(codec_streams.values())
    assert _java("write", stream_node[1], ",".join(names), ",".join(codec_streams), str(N)) == [f"written {N}"] * len(names)
    for codec, stream in codec_streams.items():
        reader = StreamBatchReader(parse_stream_options({"uri": stream_node[1], "stream": stream, "connectionTimeout": "20"}))
        rows = [
            (o, b)
            for p in reader.partitions()
            for batch in reader.read(p)
            for o, b in zip(batch.column("offset").to_pylist(), batch.column("body").to_pylist(), strict=True)
        ]
        assert rows == list(enumerate(_bodies())), codec


def test_the_java_client_reads_what_the_connector_compressed(stream_node: Node, codec_streams: dict[str, str]) -> None:
    for codec, stream in codec_streams.items():
        options = parse_sink_options({"uri": stream_node[1], "stream": stream, "subEntrySize": "100", "compression": codec})
        publisher = StreamPartitionPublisher(options, producer_for("interop-" + uuid.uuid4().hex, 0, None))
        assert asyncio.run(publisher.publish([pa.RecordBatch.from_pydict({"body": _bodies()})])).confirmed == N, codec
    crc = zlib.crc32(b"".join(b + b"\n" for b in _bodies()))
    names = ",".join(codec_streams.values())
    assert _java("read", stream_node[1], names, str(N)) == [f"read {N} crc {crc} misplaced 0"] * len(codec_streams)
