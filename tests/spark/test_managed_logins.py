"""Logins managed RabbitMQ asks for, under Spark, on the TLS node: a client certificate alone (SASL EXTERNAL) for
both sinks and both reading modes, OAuth 2 tokens of 15 seconds renewed under a queue query with a journal, a
streaming sink and a stream query for over three expiries (exactly once, no reconnect), and refusals (a client
certificate, a token endpoint) failing the query within seconds with an error that names the option."""

from __future__ import annotations

import glob
import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pika
import pytest

from .. import brokers
from ..auth.helpers import CLIENT_SECRET, TokenServer, cert, oauth_node, signer, tls_node, unique

# pinned: what is tested is the broker's side and the clients', the same on every PySpark line (CI time).
pytestmark = [pytest.mark.spark, pytest.mark.pinned, pytest.mark.timeout(400)]

TOKEN_LIFETIME = 15.0


def declare(queue: str | None = None, stream: str | None = None) -> None:
    """As guest, on the TLS node's plain port (the tests' own set-up, not the logins under test)."""
    if not brokers.OAUTH_URL:
        pytest.skip("AMQP_TEST_OAUTH_URL not set")
    conn = pika.BlockingConnection(pika.URLParameters(brokers.OAUTH_URL))
    try:
        ch = conn.channel()
        if queue:
            ch.queue_declare(queue, durable=True)
        if stream:
            ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    finally:
        conn.close()


def delete(*queues: str) -> None:
    assert brokers.OAUTH_URL
    conn = pika.BlockingConnection(pika.URLParameters(brokers.OAUTH_URL))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_delete(q)
    finally:
        conn.close()


def with_options(builder: Any, options: dict[str, str]) -> Any:
    for key, value in options.items():
        builder = builder.option(key, value)
    return builder


def ids_in(spark: Any, path: Path) -> list[str]:
    if not glob.glob(f"{path}/*.parquet"):
        return []
    return [r["message_id"] for r in spark.read.parquet(str(path)).collect()]


def test_a_client_certificate_alone_logs_in_both_sinks_and_both_modes(spark: Any, tmp_path: Path) -> None:
    amqps, stream_tls, tls_dir = tls_node()
    queue, stream = unique("cert-queue"), unique("cert-stream")
    declare(queue=queue, stream=stream)
    with open(f"{tls_dir}/key-password.txt") as f:
        passphrase = f.read().strip()
    certificate = cert(tls_dir, "certuser")  # certuser has no password: only EXTERNAL logs it in
    # The uri's host is 127.0.0.1; with tls.serverName the name checked is localhost (which the server certificate also has).
    named = {**certificate, "tls.serverName": "localhost"}
    encrypted = {**certificate, "tls.keyFile": f"{tls_dir}/certuser-key-encrypted.pem", "tls.keyPassword": passphrase}
    expected = [f"m{i}" for i in range(40)]
    try:
        # 1. the AMQP 0-9-1 sink, a batch write, with an encrypted key
        rows = [(f"body {i}".encode(), f"m{i}") for i in range(40)]
        frame = spark.createDataFrame(rows, "body binary, message_id string")
        with_options(frame.write.format("amqp").option("uri", amqps).option("routingKey", queue), encrypted).mode("append").save()
        # 2. a queue query into 3. the stream-protocol sink, a streaming write
        source = with_options(spark.readStream.format("amqp").option("uri", amqps).option("queue", queue), named).load()
        sink = source.select("body", "message_id").writeStream.format("amqp").option("uri", stream_tls).option("stream", stream)
        sink = with_options(sink, certificate).option("checkpointLocation", str(tmp_path / "sink-checkpoint"))
        query = sink.trigger(availableNow=True).start()
        assert query.awaitTermination(120) and query.exception() is None
        # 4. a stream query over the stream protocol
        read = with_options(spark.readStream.format("amqp").option("uri", stream_tls).option("stream", stream), certificate).load()
        out = tmp_path / "out"
        writer = read.select("message_id").writeStream.format("parquet").option("path", str(out))
        query = writer.option("checkpointLocation", str(tmp_path / "read-checkpoint")).trigger(availableNow=True).start()
        assert query.awaitTermination(120) and query.exception() is None
        assert sorted(ids_in(spark, out)) == sorted(expected)
    finally:
        delete(queue, stream)


def test_a_refused_client_certificate_fails_the_query_within_seconds(spark: Any) -> None:
    amqps, _, tls_dir = tls_node()
    queue = unique("refused-cert")
    declare(queue=queue)
    try:
        reader = spark.readStream.format("amqp").option("uri", amqps).option("queue", queue).option("connectionTimeout", "60")
        started = time.monotonic()
        query = with_options(reader, cert(tls_dir, "untrusted")).load().writeStream.format("noop").start()
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
        elapsed = time.monotonic() - started
    finally:
        delete(queue)
    said = str(info.value)
    assert "refused the client certificate in 'tls.certFile'" in said and "TLSV1_ALERT_UNKNOWN_CA" in said
    # Spark's own start takes some of it; retried as a network fault it took connectionTimeout (60 s) and more.
    assert elapsed < 30.0, f"{elapsed:.0f}s"


def connected_at() -> dict[str, set[Any]]:
    """The TLS node's connections by client name: when each connected (a reconnect adds a time)."""
    seen: dict[str, set[Any]] = defaultdict(set)
    for command in ("list_connections", "list_stream_connections"):
        for item in json.loads(brokers.tls_ctl(command, "-q", "--formatter", "json", "client_properties", "connected_at") or "[]"):
            for key, _type, value in item.get("client_properties", []):
                if key == "connection_name":
                    seen[value].add(item["connected_at"])
    return seen


class Publisher(threading.Thread):
    """Publishes m0, m1, … to a queue every 50 ms (guest, the plain port) until stopped."""

    def __init__(self, queue: str) -> None:
        super().__init__(name="publisher", daemon=True)
        self.queue = queue
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        assert brokers.OAUTH_URL
        conn = pika.BlockingConnection(pika.URLParameters(brokers.OAUTH_URL))
        ch = conn.channel()
        ch.confirm_delivery()
        while not self.stopping.is_set():
            ch.basic_publish("", self.queue, b"x" * 100, pika.BasicProperties(message_id=f"m{self.sent}", delivery_mode=2))
            self.sent += 1
            time.sleep(0.05)
        conn.close()


def test_queries_and_a_sink_outlive_three_expiries_of_their_tokens(spark: Any, tmp_path: Path, capsys: Any) -> None:
    """queue (journal) -> stream-protocol sink -> stream -> stream query over the stream protocol, every login a
    15-second token from one endpoint, for 50 s; then the endpoint refuses and the queries fail saying so. No
    token and not the client secret in explain(), the checkpoints, the journal or the progress."""
    amqp, stream_uri, tls_dir = oauth_node()
    queue, stream = unique("oauth-queue"), unique("oauth-stream")
    declare(queue=queue, stream=stream)
    publisher = Publisher(queue)
    out = tmp_path / "out"
    with TokenServer(signer(tls_dir), lifetime=TOKEN_LIFETIME) as server:
        tokens = server.options()
        source = with_options(spark.readStream.format("amqp").option("uri", amqp).option("queue", queue), tokens)
        source = source.option("journalLocation", str(tmp_path / "journal")).option("maxMessagesPerTrigger", "200").load()
        sink = source.select("body", "message_id").writeStream.format("amqp").option("uri", stream_uri).option("stream", stream)
        forward = with_options(sink, tokens).option("checkpointLocation", str(tmp_path / "c1")).trigger(processingTime="2 seconds")
        read = with_options(spark.readStream.format("amqp").option("uri", stream_uri).option("stream", stream), tokens).load()
        writer = read.select("message_id").writeStream.format("parquet").option("path", str(out))
        writer = writer.option("checkpointLocation", str(tmp_path / "c2")).trigger(processingTime="2 seconds")
        source.explain(True)
        read.explain(True)
        queries = [forward.start(), writer.start()]
        seen: dict[str, set[Any]] = defaultdict(set)
        try:
            publisher.start()
            started = time.monotonic()
            while time.monotonic() - started < 3.4 * TOKEN_LIFETIME:  # past 3 expiries of the first tokens
                for name, times in connected_at().items():
                    seen[name] |= times
                assert all(q.isActive for q in queries), [str(q.exception()) for q in queries]
                time.sleep(2.0)
            publisher.stopping.set()
            publisher.join(10)
            expected = {f"m{i}" for i in range(publisher.sent)}
            deadline = time.monotonic() + 60
            while set(ids_in(spark, out)) != expected and time.monotonic() < deadline:
                time.sleep(1.0)
            got = ids_in(spark, out)
            assert len(got) == len(set(got)) == len(expected) and set(got) == expected  # exactly once
            for name, times in connected_at().items():
                seen[name] |= times
            # The long-lived connections: the queue source's consumer and stream planning, each connected once.
            long_lived = {n: t for n, t in seen.items() if (n.startswith("spark-amqp source") and "depth" not in n) or "planner" in n}
            assert len(long_lived) == 2 and all(len(t) == 1 for t in long_lived.values()), long_lived
            assert server.issued >= 4  # the first tokens, and renewals: each process shares one token at a time
            secrets = [CLIENT_SECRET.encode(), *(t.encode() for t in server.given)]
            printed = capsys.readouterr()
            assert "amqp" in printed.out and not any(s.decode() in printed.out + printed.err for s in secrets)
            assert not any(s.decode() in str(q.recentProgress) for q in queries for s in secrets)
            files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".parquet")]
            # The journal's entries go once their batch is committed: what is left of it is looked at too.
            assert any(p.parent.name == "offsets" for p in files) and (tmp_path / "journal").is_dir()
            assert not [p for p in files for s in secrets if s in p.read_bytes()]

            server.refusing = True
            for query in queries:
                with pytest.raises(Exception) as info:
                    query.awaitTermination(3 * TOKEN_LIFETIME)
                said = str(info.value)
                assert "refused to issue a token" in said and "oauth2.tokenEndpoint" in said and CLIENT_SECRET not in said
        finally:
            publisher.stopping.set()
            for query in queries:
                query.stop()
            delete(queue, stream)
