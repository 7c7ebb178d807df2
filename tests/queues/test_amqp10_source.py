"""Queue mode over AMQP 1.0 (``protocol=amqp1.0``), driven without Spark, on the embedded broker and every RabbitMQ
4.x in the run: the same rows as over AMQP 0-9-1, settlement only on commit, credit as the prefetch window, dropped
connections and a journal; on RabbitMQ 3.10, which does not speak AMQP 1.0, a clear error at once."""

from __future__ import annotations

import collections
import datetime
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest

from spark_amqp.errors import AmqpOptionError, AmqpSourceError
from spark_amqp.queues.amqp10_session import _Link, _settle
from spark_amqp.queues.inbox import Delivery
from spark_amqp.queues.intake import Intake
from spark_amqp.queues.ledger import RedeliveryFilter, fingerprint
from spark_amqp.queues.options import parse_source_options
from spark_amqp.stream_protocol import core
from spark_amqp.streams.options import parse_stream_options

from .. import amqp10_fixtures
from ..broker.helpers import consume_n, wait_for
from ..brokers import REAL, counts, drop_source_connections, publish
from ..brokers import version as pika_version
from .core_spy import watch
from .driver import MicroBatchDriver
from .slow_reader import hold_deliveries_until_measured

OLDER = [b for b in REAL if b.version < (4, 0)]

# The fixtures each RabbitMQ 4.x and its fresh queues (tests/amqp10_fixtures.py).
url = amqp10_fixtures.url
queues = amqp10_fixtures.queues


def _driver(url: str, queue: str, **options: object) -> MicroBatchDriver:
    return MicroBatchDriver(url, queue, protocol="amqp1.0", **options)


def _plan(d: MicroBatchDriver, max_rows: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    planned = d.plan(max_rows)
    assert planned is not None, "no batch"
    return planned


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["message_id"] for r in rows]


def _publish_ids(url: str, queue: str, n: int) -> None:
    publish(url, queue, [b"m%d" % i for i in range(n)], declare=False, message_id=lambda i: f"id-{i}")


@pytest.mark.parametrize("path", ["core", "python"])
@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_rows_are_the_rows_amqp_0_9_1_reads(url: str, queues: Any, kind: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On both paths: the compiled core makes the property columns of a batch over AMQP 1.0 (``reading.core_properties``)
    where it is installed, Python otherwise."""
    if path == "core" and core.CORE is None:
        pytest.skip(f"no compiled core: {core.PATH}")
    made = watch(monkeypatch)
    if path == "python":
        monkeypatch.setattr(core, "CORE", None)
    one, other = queues(kind), queues(kind)
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    props = [
        pika.BasicProperties(),
        pika.BasicProperties(
            message_id="m-1",
            correlation_id="c-1",
            content_type="application/json",
            content_encoding="gzip",
            type="order",
            app_id="shop",
            user_id="guest",
            reply_to="replies",
            expiration="60000",
            priority=3,
            delivery_mode=2,
            timestamp=int(when.timestamp()),
            headers={"s": "text", "i": 7, "b": True, "t": when, "bin": b"\xff\x00", "n": None, "l": [1, "a"]},
        ),
        pika.BasicProperties(delivery_mode=1, headers={}),
    ]
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for q in (one, other):
        for i, p in enumerate(props):
            ch.basic_publish("", q, b"body-%d" % i, p)
    conn.close()

    over_091 = MicroBatchDriver(url, one)
    over_10 = _driver(url, other)
    try:
        rows_091, rows_10 = (sorted(d.drain(3), key=lambda r: r["body"]) for d in (over_091, over_10))
    finally:
        over_091.close()
        over_10.close()
    assert len(rows_10) == 3

    def comparable(row: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in row.items() if k not in ("queue", "routing_key", "delivery_tag")}
        kept["headers"] = dict(row["headers"] or {})  # a map's order is the broker's
        return kept

    # What RabbitMQ's conversion to AMQP 1.0 cannot carry (docs/amqp-1.0.md): no delivery mode reads as 1 (the
    # header's durable=false, as for mode 1); array and table headers are dropped (application properties hold
    # simple values only); an empty header table is no application-properties section.
    expected = [comparable(r) for r in rows_091]
    assert (
        expected[0]["delivery_mode"] is None and expected[1]["headers"].pop("l", '[1,"a"]') == '[1,"a"]'
    )  # (4.3's quorum queues drop it for either)
    expected[0]["delivery_mode"] = 1
    assert rows_091[2]["headers"] == [] and rows_10[2]["headers"] is None
    assert [comparable(r) for r in rows_10] == expected
    assert [r["routing_key"] for r in rows_10] == [other] * 3 and [r["queue"] for r in rows_10] == [other] * 3
    assert (made and all(made)) if path == "core" else not made, f"the core made the property columns of batches: {made}"


def test_every_message_once_with_credit_as_the_prefetch_window(url: str, queues: Any) -> None:
    q = queues()
    _publish_ids(url, q, 200)
    d = _driver(url, q, maxMessagesPerTrigger=7, prefetch=20)
    try:
        d.runtime.ensure_started()
        wait_for(lambda: counts(url, q, None)[1] == 20, timeout=15)  # no more unsettled than the window
        rows = d.drain(200, timeout=60)
        assert sorted(_ids(rows)) == sorted(f"id-{i}" for i in range(200))
        assert not any(r["redelivered"] for r in rows) and d.batches >= 28
        d.idle_until(lambda: counts(url, q, None) == (0, 0))
    finally:
        d.close()


def test_nothing_is_settled_before_commit_and_a_commit_settles_exactly_its_batch(url: str, queues: Any) -> None:
    q = queues()
    _publish_ids(url, q, 10)
    d = _driver(url, q, maxMessagesPerTrigger=4, prefetch=10)
    try:
        d.runtime.ensure_started()
        wait_for(lambda: counts(url, q, None) == (0, 10))
        # Every delivery here, not just sent: a plan made while some were still on their way (ci70, a loaded
        # machine) took fewer than four, and its commit then rightly settled fewer.
        session = d.runtime.session
        assert session is not None
        wait_for(lambda: d.runtime.latest_offset(d.start, 0) is not None and len(session.inbox) + len(d.runtime.buffer) >= 10)
        start, end = _plan(d, 4)
        assert len(d.run_batch(start, end)) == 4
        d.runtime.commit(start)  # an older offset: nothing
        assert counts(url, q, None) == (0, 10)
        d.runtime.commit(end)
        assert wait_for(lambda: counts(url, q, None) == (0, 6))
    finally:
        d.close()
    assert wait_for(lambda: counts(url, q, None) == (6, 0))


def test_a_stopped_query_releases_its_deliveries_uncounted_on_4_3(url: str, queues: Any) -> None:
    q = queues("quorum")
    _publish_ids(url, q, 10)
    d = _driver(url, q, maxMessagesPerTrigger=5, prefetch=10)
    try:
        d.run_batch(*_plan(d))  # a batch Spark has not committed, five more delivered
        wait_for(lambda: counts(url, q, None) == (0, 10), timeout=15)
    finally:
        d.close()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = consume_n(conn, ch, q, 10)
    conn.close()
    assert sorted(p.message_id for _, p, _ in got) == sorted(f"id-{i}" for i in range(10))
    # Released, not returned: RabbitMQ 4.3 does not count them towards a quorum queue's delivery-limit (4.0
    # counts a release as it counts a nack over AMQP 0-9-1).
    expected = {"x-acquired-count": 1} if pika_version(url) >= (4, 3) else {"x-delivery-count": 1}
    assert all(m.redelivered and p.headers == expected for m, p, _ in got), [p.headers for _, p, _ in got]


def test_on_delivery_limit_dead_letter_settles_modified_with_a_reason_and_reads_on(url: str, queues: Any) -> None:
    dlq = queues("classic")
    q = queues("quorum", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    _publish_ids(url, q, 6)
    for _ in range(3):  # each consumed and taken back with the connection: x-delivery-count 3
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=6)
        assert len(consume_n(conn, ch, q, 6)) == 6
        conn.close()
    publish(url, q, [b"fresh%d" % i for i in range(4)], declare=False, message_id=lambda i: f"fresh-{i}")
    d = _driver(url, q, maxMessagesPerTrigger=20, prefetch=40, maxDeliveryCount=3, onDeliveryLimit="deadLetter")
    try:
        rows = d.drain(4, timeout=30)
        assert sorted(_ids(rows)) == [f"fresh-{i}" for i in range(4)]  # the aged ones never reach Spark
        assert wait_for(lambda: counts(url, dlq, None)[0] == 6, timeout=15), counts(url, dlq, None)
        assert d.runtime.metrics.dead_lettered == 6
        d.run_batch(d.start, d.start)  # Spark commits the last batch: the fresh ones are settled
        d.idle_until(lambda: counts(url, q, None) == (0, 0), timeout=30)
    finally:
        d.close()
    # Read over AMQP 1.0: RabbitMQ gives the annotation (and its death annotations) to AMQP 1.0 consumers.
    reader = _driver(url, dlq)
    try:
        dead = reader.drain(6, timeout=30)
    finally:
        reader.close()
    assert sorted(_ids(dead)) == [f"id-{i}" for i in range(6)]
    for row in dead:
        headers = dict(row["headers"])
        why = headers["x-opt-spark-amqp-reason"]
        assert f"returned 3 times (x-delivery-count) to the spark-amqp query reading queue '{q}'" in why, headers
        assert headers["x-last-death-reason"] == "rejected" and headers["x-last-death-queue"] == q, headers


def test_on_delivery_limit_options() -> None:
    base = {"uri": "amqp://h/", "queue": "q"}
    with pytest.raises(AmqpOptionError, match=r"option 'onDeliveryLimit' must be fail or deadLetter, got 'drop'"):
        parse_source_options({**base, "onDeliveryLimit": "drop"})
    with pytest.raises(AmqpOptionError, match=r"modified outcome, which carries the reason .*set option 'protocol' to 'amqp1.0'"):
        parse_source_options({**base, "onDeliveryLimit": "deadLetter"})
    with pytest.raises(AmqpOptionError, match=r"option 'onDeliveryLimit' only applies without 'journalLocation'"):
        parse_source_options({**base, "protocol": "amqp1.0", "onDeliveryLimit": "deadLetter", "journalLocation": "/tmp/j"})
    with pytest.raises(AmqpOptionError, match=r"needs a limit: maxDeliveryCount=0 sets none"):
        parse_source_options({**base, "protocol": "amqp1.0", "onDeliveryLimit": "deadLetter", "maxDeliveryCount": "0"})
    assert parse_source_options({**base, "protocol": "amqp1.0", "onDeliveryLimit": "DeadLetter"}).dead_letter_at_limit
    assert not parse_source_options({**base, "onDeliveryLimit": "fail"}).dead_letter_at_limit


def test_a_dropped_connection_loses_and_duplicates_nothing(url: str, queues: Any) -> None:
    q = queues("quorum")
    _publish_ids(url, q, 60)
    d = _driver(url, q, maxMessagesPerTrigger=10, prefetch=30)
    try:
        start, end = _plan(d)
        first = d.run_batch(start, end)  # planned, not committed
        # This run's connection only: other tests (the Delta tests too, run beside these) have theirs on the broker.
        assert wait_for(lambda: drop_source_connections(url, None, f"spark-amqp source {d.runtime.run_id}") >= 1)
        rows = d.drain(60, timeout=60)
        assert sorted(_ids(rows)) == sorted(f"id-{i}" for i in range(60)), "lost or duplicated"
        assert d.runtime.intake.sessions_lost >= 1 and d.runtime.intake.copies_dropped >= len(first)
        d.idle_until(lambda: counts(url, q, None) == (0, 0), timeout=30)
    finally:
        d.close()


def test_a_journal_gives_exactly_once_through_a_crash(url: str, queues: Any, tmp_path: Path) -> None:
    q, journal = queues(), tmp_path / "journal"
    _publish_ids(url, q, 30)
    first = _driver(url, q, journalLocation=str(journal), maxMessagesPerTrigger=10, prefetch=30)
    first.runtime.ensure_started()
    first.runtime.session.ack = lambda *args: None  # type: ignore[method-assign, union-attr]  # dies before it settles
    start, end = _plan(first)
    batch = first.run_batch(start, end)
    first.close()
    assert wait_for(lambda: counts(url, q, None) == (30, 0))  # the journalled batch came back too

    second = _driver(url, q, journalLocation=str(journal), maxMessagesPerTrigger=10, prefetch=30)
    try:
        second.start = start
        assert second.run_batch(start, end, commit_previous=False) == batch  # the replay is the batch, every column
        # The first batch is what had arrived when it was planned: up to 10 (7 in a CI run), so no fixed count below.
        rest = second.drain(30)[len(batch) :]
        assert sorted(_ids(batch + rest)) == sorted(f"id-{i}" for i in range(30))
        assert second.runtime.intake.copies_dropped == len(batch)
        second.idle_until(lambda: counts(url, q, None) == (0, 0), timeout=30)
    finally:
        second.close()


def test_available_now_and_the_backlog_come_from_the_links_available(url: str, queues: Any) -> None:
    q = queues()
    _publish_ids(url, q, 25)
    d = _driver(url, q, maxMessagesPerTrigger=10, prefetch=20)
    try:
        d.runtime.prepare_available_now()
        assert d.runtime.available_now is not None and d.runtime.available_now.left == {q: 25}
        _publish_ids(url, q, 5)  # after the run started: not this run's
        wait_for(lambda: (d.runtime.backlog() or {}).get(q, {}).get("ready") == 10, timeout=15)
        rows = d.drain(25, max_rows=10)
        assert len(rows) == 25 and d.plan(wait=1.0) is None
    finally:
        d.close()


def test_available_now_reads_what_is_on_its_way_when_the_links_available_is_nil(
    url: str, queues: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker reports a queue empty once it has sent its last transfers, which a loaded consumer may not have read."""
    q = queues()
    _publish_ids(url, q, 30)
    gate, measured = hold_deliveries_until_measured(monkeypatch, after=10)
    d = _driver(url, q, maxMessagesPerTrigger=10, prefetch=100)
    try:
        d.runtime.prepare_available_now()
        while (planned := d.plan(wait=3)) is not None:
            d.run_batch(*planned)
        assert measured and measured[0] == {q: 0}, measured
        assert _ids(d.rows) == [f"id-{i}" for i in range(30)]
    finally:
        gate.set()
        d.close()


def test_declare_and_bind_the_queue_through_the_management_node(url: str, queues: Any) -> None:
    q, exchange = f"a10-declared-{uuid.uuid4().hex[:8]}", f"a10x-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().exchange_declare(exchange, "direct", auto_delete=True)
    d = _driver(url, q, declareQueue="true", queueArguments='{"x-queue-type": "quorum"}', bindExchange=exchange, bindingKey="k")
    try:
        d.runtime.ensure_started()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, "k", b"routed", pika.BasicProperties(message_id="r-1"), mandatory=True)
        rows = d.drain(1, timeout=15)
        assert [(r["body"], r["exchange"], r["routing_key"]) for r in rows] == [(b"routed", exchange, "k")]
        assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    finally:
        d.close()
        conn.channel().queue_delete(q)
        conn.close()


def test_a_second_exactly_once_query_fails_fast_and_the_first_goes_on(url: str, queues: Any, tmp_path: Path) -> None:
    q = queues("quorum")
    _publish_ids(url, q, 20)
    first = _driver(url, q, journalLocation=str(tmp_path / "j1"), maxMessagesPerTrigger=10, prefetch=20)
    second = _driver(url, q, journalLocation=str(tmp_path / "j2"))
    try:
        first.runtime.ensure_started()
        with pytest.raises(AmqpSourceError, match=rf"queue '{q}' on .* has another consumer: 2 consumers counted.*exclusiveConsumer=false"):
            second.plan(wait=5.0)
        rows = first.drain(20, timeout=30)
        assert sorted(_ids(rows)) == sorted(f"id-{i}" for i in range(20))
    finally:
        second.close()
        first.close()


def test_a_missing_queue_is_a_clear_error(url: str) -> None:
    d = _driver(url, f"missing-{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(
            AmqpSourceError,
            match=r"\(AMQP 1\.0\): not found \(404 NOT_FOUND - queue 'missing-\w+' in vhost '/' not found\); create it first, or let the connector declare it",
        ):
            d.plan(wait=1.0)
    finally:
        d.close()


def test_a_stream_is_refused(url: str, queues: Any) -> None:
    q = queues("stream")
    d = _driver(url, q)
    try:
        with pytest.raises(AmqpSourceError, match=f"'{q}'.*stream"):
            d.runtime.ensure_started()  # RabbitMQ 4.3 says at the attach that the link copies
            publish(url, q, [b"x"], declare=False)  # 4.0 does not: the first delivery's x-stream-offset says it
            wait_for(lambda: d.runtime.session is not None and d.runtime.session.fatal is not None, timeout=15)
            d.plan(wait=1.0)
    finally:
        d.close()


@pytest.mark.skipif(not OLDER, reason="no RabbitMQ 3.x in AMQP_TEST_BROKERS")
def test_a_broker_without_amqp_1_0_is_a_clear_error_at_once() -> None:
    d = _driver(OLDER[0].url, "q")
    try:
        with pytest.raises(AmqpSourceError, match=r"does not speak AMQP 1.0"):
            d.plan(wait=1.0)
    finally:
        d.close()


# -- without a broker -------------------------------------------------------------------------------


class _Receiver:
    def __init__(self) -> None:
        self.settled: list[tuple[int, int, bytes]] = []

    def settle(self, first: int, last: int, outcome: bytes) -> None:
        self.settled.append((first, last, outcome))


def test_runs_of_tags_settle_as_ranges_and_singles_count_once() -> None:
    link = _Link("s", "q")
    for tag in [1, 2, 3, 5, 6, 9]:  # 4, 7 and 8 went to another queue's link
        link.add(tag)
    link.single(5)
    assert link.unsettled == 5
    assert link.up_to(5) == [(1, 3), (5, 5)] and link.unsettled == 2  # 5 was settled on its own: counted once
    assert link.up_to(100) == [(6, 6), (9, 9)] and link.unsettled == 0 and not link.runs


def test_a_range_across_the_delivery_ids_wrap_is_two_dispositions() -> None:
    receiver = _Receiver()
    _settle(receiver, (1 << 32) - 2, (1 << 32) + 1, b"A")  # type: ignore[arg-type]
    assert receiver.settled == [(0xFFFFFFFE, 0xFFFFFFFF, b"A"), (0, 1, b"A")]


def test_protocol_options() -> None:
    base = {"uri": "amqp://guest@localhost/", "queue": "q"}
    assert parse_source_options({**base, "protocol": "AMQP1.0"}).connection.amqp10
    assert not parse_source_options({**base, "protocol": "amqp0-9-1"}).connection.amqp10
    assert "(AMQP 1.0)" in parse_source_options({**base, "protocol": "amqp1.0"}).connection.display_uri
    with pytest.raises(AmqpOptionError, match=r"'protocol' must be amqp0-9-1 or amqp1.0, got '1.0'"):
        parse_source_options({**base, "protocol": "1.0"})
    journalled = parse_source_options({**base, "protocol": "amqp1.0", "journalLocation": "/tmp/j"})
    assert journalled.exclusive_consumer  # as over AMQP 0-9-1: RabbitMQ's management node counts the consumers
    with pytest.raises(AmqpOptionError, match="option 'protocol' is for amqp:// and amqps:// uris"):
        parse_stream_options({"uri": "rabbitmq-stream://guest@localhost/", "stream": "s", "protocol": "amqp1.0"})
    assert parse_stream_options({"uri": "amqp://guest@localhost/", "stream": "s", "protocol": "amqp1.0"}).connection.amqp10


def test_a_broker_that_does_not_mark_redeliveries_still_has_its_copies_recognised() -> None:
    def delivery(tag: int) -> Delivery:
        return Delivery("s2", "q", tag, False, "", "q", pika.BasicProperties(message_id="id-1"), b"body")

    for unmarked, dropped in ((True, 1), (False, 0)):
        filt = RedeliveryFilter(by="messageId")
        filt.expect([(("q", fingerprint(delivery(0), "messageId")), 7)])  # batch 7 holds id-1; its settlement was lost
        intake = Intake(filt)
        intake.take(collections.deque([delivery(1), delivery(2)]), unmarked=unmarked)
        assert intake.copies_dropped == dropped and len(intake.buffer) == 2 - dropped  # the second is a new message
