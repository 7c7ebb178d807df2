"""What the sink's tests without Spark share: a table of rows published as one task of the sink would."""

from __future__ import annotations

import asyncio

import pyarrow as pa
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.sink.columns import MessageBuilder
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.publisher import PartitionPublisher
from spark_amqp.sink.writer import connected


def publish_table(url: str, table: dict, **options: str):  # type: ignore[no-untyped-def,type-arg]
    """The result of publishing ``table`` (column -> values) with the sink's ``options``, as one partition."""
    opts = parse_sink_options({"uri": url, **options})
    batch = pa.RecordBatch.from_pydict(table)
    builder = MessageBuilder(opts)
    return asyncio.run(PartitionPublisher(opts).publish([builder.messages(batch)], "test", connected(builder)))


def both_nodes(first: EmbeddedBroker, second: EmbeddedBroker) -> str:
    """A uri naming two embedded brokers as two nodes, ``first`` first (the ``listed`` fixture keeps that order)."""
    return first.url.replace(f"@{first.host}:{first.port}/", f"@{first.host}:{first.port},{second.host}:{second.port}/")
