"""Broker-agnostic checks: ready/unacked counts on the embedded broker or a local RabbitMQ."""

from __future__ import annotations

import shutil
import subprocess

import pika

from spark_amqp.broker import EmbeddedBroker


def counts(url: str, queue: str, embedded: EmbeddedBroker | None) -> tuple[int, int]:
    """(ready, unacked) for ``queue``."""
    if embedded is not None and url == embedded.url:
        stats = embedded.queue_stats(queue)
        return stats["ready"], stats["unacked"]
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        raise RuntimeError("rabbitmqctl is needed to read unacked counts from RabbitMQ")
    out = subprocess.run(
        [ctl, "list_queues", "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == queue:
            return int(parts[1]), int(parts[2])
    raise KeyError(queue)


def publish(url: str, queue: str, bodies: list[bytes], declare: bool = True, **props_kwargs: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if declare:
        ch.queue_declare(queue)
    ch.confirm_delivery()
    for i, body in enumerate(bodies):
        props = pika.BasicProperties(**{k: (v(i) if callable(v) else v) for k, v in props_kwargs.items()})
        ch.basic_publish("", queue, body, props)
    conn.close()


def drop_source_connections(url: str, embedded: EmbeddedBroker | None, name_contains: str = "spark-amqp source") -> int:
    """Cut the connections whose client name holds ``name_contains`` (by default the streaming source's
    consumer connections), as a network failure would; how many were cut."""
    if embedded is not None and url == embedded.url:
        return embedded.drop_connections(name_contains=name_contains)
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        raise RuntimeError("rabbitmqctl is needed to close connections on RabbitMQ")
    listing = subprocess.run(
        [ctl, "list_connections", "-q", "--no-table-headers", "pid", "client_properties"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    cut = 0
    for line in listing.splitlines():
        pid, _, props = line.partition("\t")
        if name_contains in props and "depth" not in props:
            subprocess.run([ctl, "close_connection", pid, "test: connection dropped"], check=True, capture_output=True, timeout=60)
            cut += 1
    return cut
