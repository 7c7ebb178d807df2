"""Every Python example of README.md and docs/*.md, run against a fresh embedded broker, so none can rot.

The convention (docs/development.md, "Examples in the docs are tested"): a block runs unless the line
before it is ``<!-- not run: reason -->``; ``<!-- needs delta -->`` marks a block that writes Delta
(marker ``delta``: ``make test`` runs it on the Delta line). The examples are written against
placeholders, a broker at ``amqps://etl@rabbit.internal:5671/prod``, paths under ``/Volumes/main/etl/``
and tables ``main.etl.*``, which are swapped for the embedded broker, a temporary directory and a
database in it; ``spark``, ``password``, ``uri`` and ``dbutils`` are given. Streaming queries run with
``trigger(availableNow=True)`` so that they end once they have read what the broker holds.
"""

from __future__ import annotations

import ast
import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from ..markdown import PAGES, Block, code_blocks

PASSWORD = "guest"
PLACEHOLDER_URI = "amqps://etl@rabbit.internal:5671/prod"
PLACEHOLDER_STREAM_URI = "rabbitmq-stream://etl@rabbit.internal:5552/prod"
PLACEHOLDER_VOLUME = "/Volumes/main/etl/"
PLACEHOLDER_SCHEMA = "main.etl."
GIVEN = ("spark", "password", "uri", "dbutils")
MESSAGES = 30
REGIONS = ("eu-west", "eu-central", "us-east")


def _uses_spark(block: Block) -> bool:
    return any(isinstance(node, ast.Name) and node.id in ("spark", "dbutils") for node in ast.walk(ast.parse(block.code)))


def _examples() -> list[Any]:
    params = []
    for page in PAGES:
        for block in code_blocks(page):
            if block.lang != "python" or (block.marker or "").startswith("not run"):
                continue
            marks = []
            if _uses_spark(block):
                # The examples show the pinned PySpark's API: running them on every line adds CI time, not cover.
                marks += [pytest.mark.spark, pytest.mark.pinned]
            if block.marker == "needs delta":
                marks.append(pytest.mark.delta)
            params.append(pytest.param(block, id=block.name, marks=marks))
    return params


def _stock(url: str) -> None:
    """What the examples read and write: the queues, streams, super stream and exchange the docs name."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for queue in ("orders", "refunds"):
        ch.queue_declare(queue, durable=True)
    for stream in ("events", "audit", *(f"orders-{i}" for i in range(len(REGIONS)))):
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    # As `rabbitmq-streams add_super_stream orders --partitions 3` makes it.
    ch.exchange_declare("orders", "direct", durable=True, arguments={"x-super-stream": True})
    for i in range(len(REGIONS)):
        ch.queue_bind(f"orders-{i}", "orders", str(i), arguments={"x-stream-partition-order": i})
    ch.exchange_declare("events", "topic", durable=True)
    ch.queue_declare("events-copy", durable=True)
    ch.queue_bind("events-copy", "events", "#")
    for i in range(MESSAGES):
        region = REGIONS[i % len(REGIONS)]
        order = {"id": i, "type": ("created", "paid")[i % 2], "customer_id": f"c{i % 7}", "region": region, "amount": i * 1.5}
        body = json.dumps(order).encode()
        props = pika.BasicProperties(message_id=f"m{i}", content_type="application/json", timestamp=int(time.time()))
        for target in ("orders", "refunds", "events", "audit"):
            ch.basic_publish("", target, body, props)
        # Each partition holds one region, as publishers that each write one region would make it.
        partition = f"orders-{REGIONS.index(region)}"
        ch.basic_publish("", partition, body, pika.BasicProperties(message_id=f"m{i}", headers={"x-stream-filter-value": region}))
    conn.close()


def _localised(block: Block, broker: EmbeddedBroker, tmp_path: Path, database: str) -> str:
    code = block.code.replace(PLACEHOLDER_URI, f"amqp://guest@{broker.host}:{broker.port}/%2F")
    code = code.replace(PLACEHOLDER_STREAM_URI, f"rabbitmq-stream://guest@{broker.host}:{broker.stream_port}/%2F")
    code = code.replace(PLACEHOLDER_VOLUME, f"{tmp_path}/volumes/").replace(PLACEHOLDER_SCHEMA, f"{database}.")
    # A trigger the example sets itself comes later in the chain and wins.
    code = code.replace(".writeStream", ".writeStream.trigger(availableNow=True)")
    assert "rabbit.internal" not in code and "/Volumes/" not in code, f"{block.name}: a placeholder the test does not know"
    # Blank lines in front, so that a traceback names the line in the Markdown file.
    return "\n" * (block.line - 1) + code


def _recording_queries(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    started: list[Any] = []

    def recording(method: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            query = method(self, *args, **kwargs)
            started.append(query)
            return query

        return run

    monkeypatch.setattr(DataStreamWriter, "start", recording(DataStreamWriter.start))
    monkeypatch.setattr(DataStreamWriter, "toTable", recording(DataStreamWriter.toTable))
    return started


@pytest.mark.parametrize("block", _examples())
def test_the_example_runs(block: Block, embedded: EmbeddedBroker, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _stock(embedded.url)
    namespace: dict[str, Any] = {
        "__name__": "doc_example",
        "password": PASSWORD,
        "uri": f"amqp://guest@{embedded.host}:{embedded.port}/%2F",
        "dbutils": SimpleNamespace(secrets=SimpleNamespace(get=lambda scope, key: PASSWORD)),
    }
    database = f"docs_{uuid.uuid4().hex[:8]}"
    spark = None
    started: list[Any] = []
    if _uses_spark(block):
        import pyspark
        import sparkenv

        if block.marker == "needs delta" and not sparkenv.has_delta_jars_for(pyspark.__version__):
            pytest.skip(f"no Delta Lake for PySpark {pyspark.__version__}: `make test` runs this on the Delta line")
        spark = namespace["spark"] = request.getfixturevalue("spark")
        started = _recording_queries(monkeypatch)
        if PLACEHOLDER_SCHEMA in block.code:
            spark.sql(f"CREATE DATABASE {database} LOCATION '{tmp_path / 'warehouse'}'")
    try:
        exec(compile(_localised(block, embedded, tmp_path, database), str(block.path), "exec"), namespace)
        for query in started:
            assert query.awaitTermination(180), f"{block.name}: a query did not end"
            assert query.exception() is None, query.exception()
            assert sum(p.numInputRows for p in query.recentProgress) > 0, f"{block.name}: a query read nothing"
        if spark is not None:
            from pyspark.sql import DataFrame

            left = {name: v for name, v in namespace.items() if name not in GIVEN and isinstance(v, DataFrame) and not v.isStreaming}
            assert {name: df.count() > 0 for name, df in left.items()} == dict.fromkeys(left, True), f"{block.name}: an empty DataFrame"
    finally:
        for query in started:
            if query.isActive:
                query.stop()
        if spark is not None and PLACEHOLDER_SCHEMA in block.code:
            spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
