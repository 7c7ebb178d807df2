"""A quorum queue's delivery-limit never eats messages because of the source's own restarts.

RabbitMQ 4.x drops (or dead-letters) a quorum queue's message returned more than
its delivery-limit times (20 unless set; x-delivery-limit here). Every test ages
messages with pika first (consumed, then the connection closed unacked: a return
that counts on every line), then runs the source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pytest

from spark_amqp.errors import AmqpSourceError

from ..broker.helpers import connect, consume_n, ready_count, wait_for
from ..brokers import counts, drop_source_connections, publish
from .driver import MicroBatchDriver


def _quorum(url: str, queue: str, count: int, **arguments: object) -> None:
    conn = connect(url)
    conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum", **arguments})
    conn.close()
    publish(url, queue, [b"m%d" % i for i in range(count)], declare=False, message_id=lambda i: f"id-{i}")


def _return(url: str, queue: str, count: int, times: int) -> None:
    """Each message delivered and returned ``times`` times: x-delivery-count ``times``."""
    for _ in range(times):
        conn = connect(url)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=count)
        assert len(consume_n(conn, ch, queue, count)) == count
        conn.close()


def _delivery_counts(url: str, queue: str, count: int) -> list[int]:
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=count)
    got = consume_n(conn, ch, queue, count)
    conn.close()  # they go back once more
    return sorted((p.headers or {}).get("x-delivery-count", 0) for _, p, _ in got)


def test_with_a_journal_counted_redeliveries_are_journalled_and_acked_before_any_batch(
    amqp_url: str, names, embedded_or_none, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    # x-delivery-limit 3: one more return of these drops them, on every line.
    _quorum(amqp_url, q, 20, **{"x-delivery-limit": 3})
    _return(amqp_url, q, 20, 3)
    d = MicroBatchDriver(amqp_url, q, journalLocation=str(journal), maxMessagesPerTrigger=8, prefetch=30)
    try:
        session = d.runtime.ensure_started()
        wait_for(lambda: len(session.inbox) >= 20)
        # Spark's first latestOffset: the source journals them all (in batches of at most 8), acks
        # them, and gives Spark the first of those batches.
        assert d.plan() is not None
        assert len(d.runtime.pending) == 2 and d.runtime.metrics.rescued == 20
    finally:
        d.close()  # a crash before Spark logged any of them
    assert ready_count(amqp_url, q) == 0  # acked: they are only in the journal now
    second = MicroBatchDriver(amqp_url, q, journalLocation=str(journal), maxMessagesPerTrigger=8, prefetch=30, journalRetention=2)
    try:
        rows = second.drain(20)
        assert sorted(r["message_id"] for r in rows) == sorted(f"id-{i}" for i in range(20))
        assert second.batches == 3
        second.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0) and not list(journal.iterdir()), timeout=30)
    finally:
        second.close()


def test_redeliveries_journalled_after_a_restart_follow_sparks_offsets(amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    _quorum(amqp_url, q, 20)
    first = MicroBatchDriver(amqp_url, q, journalLocation=str(journal), maxMessagesPerTrigger=5, prefetch=20)
    session = first.runtime.ensure_started()
    wait_for(lambda: len(session.inbox) >= 20)
    done = first.run_batch(*first.plan())  # batch 1 journalled, given, committed by Spark
    # The process dies: its connection drops, and the 15 prefetched come back counted.
    first.runtime.session.ack = lambda *args: None  # type: ignore[method-assign]
    assert drop_source_connections(amqp_url, embedded_or_none, f"spark-amqp source {first.runtime.run_id}") == 1
    first.close()
    second = MicroBatchDriver(amqp_url, q, journalLocation=str(journal), maxMessagesPerTrigger=5, prefetch=20, journalRetention=2)
    try:
        second.start = first.start  # Spark resumes after batch 1
        rows = second.drain(15)
        assert sorted(r["message_id"] for r in done + rows) == sorted(f"id-{i}" for i in range(20))
        assert second.runtime.metrics.rescued == 15
    finally:
        second.close()


def test_redeliveries_of_connections_lost_while_spark_is_busy_are_journalled_once(
    amqp_url: str, names, embedded_or_none, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Regression (a CI run of the executors-lost test wrote 100 ids three times): while Spark ran one long batch,
    # the source's connection went twice. Its inbox then held the counted redeliveries of a session that had ended
    # too, whose copies were coming again on the next: each session's were journalled as a batch of their own.
    q, journal = names.queue(), tmp_path / "journal"
    _quorum(amqp_url, q, 20)
    d = MicroBatchDriver(amqp_url, q, journalLocation=str(journal), maxMessagesPerTrigger=20, prefetch=20)
    try:
        session = d.runtime.ensure_started()
        wait_for(lambda: len(session.inbox) >= 20)
        for lost in (1, 2):  # no latestOffset in between: Spark is busy with the batch before
            assert drop_source_connections(amqp_url, embedded_or_none, f"spark-amqp source {d.runtime.run_id}") == 1
            wait_for(lambda: _after_losses(session.inbox, lost) >= 20, timeout=60)  # noqa: B023
        rows = d.drain(40, timeout=3)  # as many batches as the source gives in 3 s: one copy of each, not two
        assert sorted(r["message_id"] for r in rows) == sorted(f"id-{i}" for i in range(20))
        assert d.runtime.metrics.rescued == 20
    finally:
        d.close()


def _after_losses(inbox: Iterable[object], losses: int) -> int:
    """Deliveries in ``inbox`` after its ``losses``-th ``SessionClosed``."""
    from spark_amqp.queues.inbox import Delivery, SessionClosed

    seen, count = 0, 0
    for item in list(inbox):
        if isinstance(item, SessionClosed):
            seen, count = seen + 1, 0
        elif isinstance(item, Delivery) and seen >= losses:
            count += 1
    return count if seen >= losses else 0


def test_without_a_journal_the_query_fails_before_the_broker_drops_anything(
    amqp_url: str, names, embedded_or_none, broker_version, caplog
) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _quorum(amqp_url, q, 5)
    _return(amqp_url, q, 5, 16)
    # The default, 16, holds on RabbitMQ 4.x (delivery-limit 20 by default); 3.10 has no default
    # limit, so the source reads on there unless maxDeliveryCount is set.
    options = {"maxDeliveryCount": 16} if broker_version < (4, 0) else {}
    d = MicroBatchDriver(amqp_url, q, **options)
    try:
        with pytest.raises(AmqpSourceError) as info, caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            d.drain(5, timeout=30)
        message = str(info.value)
        assert f"queue '{q}'" in message and "x-delivery-count 16" in message and "journalLocation" in message, message
        assert not d.rows
    finally:
        d.close()
    # Nothing was dropped, and the failure did not count as a return on 4.3 (a nack). Waited for: the broker takes
    # the deliveries back as the source's connection closes, which a loaded machine made it see after this (ci74).
    assert wait_for(lambda: ready_count(amqp_url, q) == 5, timeout=30)
    assert _delivery_counts(amqp_url, q, 5) == [17 if broker_version < (4, 3) else 16] * 5


def test_without_a_journal_and_no_limit_on_3_10_the_query_reads_on(amqp_url: str, names, embedded_or_none, broker_version, caplog) -> None:  # type: ignore[no-untyped-def]
    if broker_version >= (4, 0):
        pytest.skip("RabbitMQ 4.x has a default delivery-limit: the previous test")
    q = names.queue()
    _quorum(amqp_url, q, 5)
    _return(amqp_url, q, 5, 3)
    d = MicroBatchDriver(amqp_url, q)
    try:
        with caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            rows = d.drain(5)
        assert sorted(r["message_id"] for r in rows) == [f"id-{i}" for i in range(5)]
        assert "came back 3 times" in caplog.text  # still said, loudly
    finally:
        d.close()


def test_max_delivery_count_zero_reads_on_regardless(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _quorum(amqp_url, q, 3)
    _return(amqp_url, q, 3, 16)
    d = MicroBatchDriver(amqp_url, q, maxDeliveryCount=0)
    try:
        assert sorted(r["message_id"] for r in d.drain(3)) == [f"id-{i}" for i in range(3)]
        d.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=30)  # RabbitMQ's counts lag
    finally:
        d.close()


def test_the_progress_shows_the_highest_delivery_count(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    _quorum(amqp_url, q, 3)
    _return(amqp_url, q, 3, 2)
    d = MicroBatchDriver(amqp_url, q)
    try:
        d.drain(3)
        assert wait_for(lambda: d.runtime.backlog(), timeout=10)[q]["deliveryCount"] == 2
    finally:
        d.close()


def test_max_delivery_count_options() -> None:
    from spark_amqp.errors import AmqpOptionError
    from spark_amqp.queues.options import parse_source_options

    base = {"uri": "amqp://h", "queue": "q"}
    assert parse_source_options(base).max_delivery_count is None
    assert parse_source_options({**base, "maxDeliveryCount": "5"}).max_delivery_count == 5
    with pytest.raises(AmqpOptionError, match="'maxDeliveryCount' only applies without 'journalLocation'"):
        parse_source_options({**base, "maxDeliveryCount": "5", "journalLocation": "/tmp/j"})
    with pytest.raises(AmqpOptionError, match="maxDeliveryCount"):
        parse_source_options({**base, "maxDeliveryCount": "-1"})
    # With a journal, prefetch need only hold one batch.
    assert parse_source_options({**base, "journalLocation": "/tmp/j", "maxMessagesPerTrigger": "100", "prefetch": "100"}).prefetch == 100
    with pytest.raises(AmqpOptionError, match="at least twice"):
        parse_source_options({**base, "maxMessagesPerTrigger": "100", "prefetch": "100"})
