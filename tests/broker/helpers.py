from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika


def connect(url: str, **overrides: Any) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    for key, value in overrides.items():
        setattr(params, key, value)
    return pika.BlockingConnection(params)


def ready_count(url: str, queue: str) -> int:
    """Ready messages, from a passive declare on a connection of its own."""
    conn = connect(url)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def drain(ch: Any, queue: str, limit: int = 10_000, ack: bool = True) -> list[tuple[Any, Any, bytes]]:
    """basic.get until empty; returns (method, properties, body) triples."""
    out = []
    for _ in range(limit):
        method, props, body = ch.basic_get(queue, auto_ack=ack)
        if method is None:
            break
        out.append((method, props, body))
    return out


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def consume_n(
    conn: pika.BlockingConnection, ch: Any, queue: str, n: int, timeout: float = 10.0, **kwargs: Any
) -> list[tuple[Any, Any, bytes]]:
    """Deliveries of a basic.consume until ``n`` arrived (left unacked)."""
    got: list[tuple[Any, Any, bytes]] = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append((m, p, b)), **kwargs)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def closed_with(fn: Callable[[], Any]) -> tuple[int, str]:
    """(reply code, reply text) of the channel close that ``fn`` runs into."""
    try:
        fn()
    except pika.exceptions.ChannelClosedByBroker as err:
        return err.reply_code, str(err.reply_text)
    raise AssertionError("the broker did not close the channel")
