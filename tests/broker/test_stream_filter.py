"""Stream filtering over AMQP 0-9-1 (RabbitMQ 3.13+), as the embedded broker must copy it.

Publishers mark messages with ``x-stream-filter-value``; a consumer's ``x-stream-filter``
makes the broker skip chunks that hold none of its values. Measured on 4.0.5 and 4.3.6: a
chunk that matches comes whole, so other values come along; 3.10 ignores the arguments.
Each burst below is confirmed before the next, so bursts are chunks of their own, and each
read waits for a last message it must get, so nothing it should not get can still be on
its way.
"""

from __future__ import annotations

from typing import Any

import pika
from spark_amqp_broker.stream_filter import BLOOM_BITS, bloom_bits

from .helpers import connect, wait_for
from .raw import FILTER, burst


def _stream(url: str, q: str) -> list[str | None]:
    """Four chunks: a and b mixed, c only, no value then b, and a last 'a' and 'c' of their own."""
    conn = connect(url)
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    chunks: list[list[str | None]] = [["a", "b"] * 50, ["c"] * 50, [None] * 20 + ["b"] * 20, ["a"], ["c"]]
    for values in chunks:
        burst(url, q, values)
    return [v for values in chunks for v in values]


def _read(url: str, q: str, last: int, **arguments: Any) -> list[int]:
    """Offsets a consumer with ``arguments`` gets, up to and including ``last``, which it must get."""
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got: list[int] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": "first", **arguments})
    wait_for(lambda: last in got or conn.process_data_events(time_limit=0.05), timeout=20)
    conn.close()
    return [o for o in got if o <= last]


def test_a_filter_sends_matching_chunks_whole_and_skips_the_others(amqp_url, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("filtered")
    values = _stream(amqp_url, q)
    every = list(range(len(values)))
    last_a, last_c = len(values) - 2, len(values) - 1
    of = {v: {i for i, x in enumerate(values) if x == v} for v in ("a", "b", "c", None)}
    by_a = _read(amqp_url, q, last_a, **{"x-stream-filter": "a"})
    by_c = _read(amqp_url, q, last_c, **{"x-stream-filter": ["zzz", "c"]})
    by_a_or_none = _read(amqp_url, q, last_a, **{"x-stream-filter": "a", "x-stream-match-unfiltered": True})
    not_a_string = _read(amqp_url, q, last_c, **{"x-stream-filter": 5})
    assert not_a_string == every  # ignored
    if broker_version < (3, 13):
        assert by_a == every[: last_a + 1] and by_c == every and by_a_or_none == every[: last_a + 1]  # 3.10 ignores filters
        return
    assert of["a"] <= set(by_a) and set(by_a) & of["b"], "the a/b chunk comes whole"
    assert not set(by_a) & (of["c"] | of[None]), "chunks without an 'a' are skipped"
    assert set(by_c) == of["c"], "one of several values"
    assert of["a"] | of[None] <= set(by_a_or_none) and not set(by_a_or_none) & of["c"]


def test_the_embedded_filter_lets_false_positives_through(embedded) -> None:  # type: ignore[no-untyped-def]
    """A Bloom filter answers 'maybe': a chunk holding only values whose bits cover a wanted value's is sent
    too, so the exactness of the source's rows rests on its own check."""
    wanted = "wanted"
    others = [f"v{i}" for i in range(2000)]
    # Values that together set the wanted value's bits, though none of them is it.
    cover = [v for v in others if bloom_bits(v) & bloom_bits(wanted)]
    picked, bits = [], 0
    for v in cover:
        if bits & bloom_bits(wanted) != bloom_bits(wanted):
            picked.append(v)
            bits |= bloom_bits(v)
    assert bits & bloom_bits(wanted) == bloom_bits(wanted) and 0 < len(picked) <= BLOOM_BITS
    q = "false-positive"
    url = embedded.url
    conn = connect(url)
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    burst(url, q, picked)
    burst(url, q, [wanted])
    got = _read(url, q, len(picked), **{"x-stream-filter": wanted})
    assert got == list(range(len(picked) + 1))


def test_a_filter_value_is_kept_as_a_header(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("filter-header")
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x", pika.BasicProperties(headers={FILTER: "eu-west"}))
    ch.basic_qos(prefetch_count=10)
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(p.headers), arguments={"x-stream-offset": "first"})
    wait_for(lambda: got or conn.process_data_events(time_limit=0.05), timeout=20)
    conn.close()
    assert got[0][FILTER] in ("eu-west", b"eu-west")
