"""The source's ack policy and redelivery handling, driven without Spark (fast), on both brokers."""

from __future__ import annotations

import collections
import datetime
import logging
import signal
import time

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.errors import AmqpSourceError
from spark_amqp.queues import runtime as runtime_module
from spark_amqp.queues.available_now import AvailableNow
from spark_amqp.queues.offset import AmqpSourceOffset

from ..broker.helpers import consume_n, wait_for
from ..brokers import counts, publish
from .driver import MicroBatchDriver
from .slow_reader import hold_deliveries_until_measured


def _bodies(rows: list[dict]) -> list[bytes]:  # type: ignore[type-arg]
    return [r["body"] for r in rows]


def test_every_message_once_then_acked(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(50)])
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=7, prefetch=20)
    try:
        rows = d.drain(50)
        assert sorted(_bodies(rows)) == sorted(b"m%d" % i for i in range(50))
        assert d.batches >= 8 and all(r["queue"] == q and not r["redelivered"] for r in rows)
        d.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0))
    finally:
        d.close()


def test_nothing_is_acked_before_commit(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(10)])
    d = MicroBatchDriver(amqp_url, q)
    start, end = d.plan()
    d.run_batch(start, end)
    # The batch ran but Spark has not committed it: a later commit of an older offset changes nothing.
    d.runtime.commit(start)
    time.sleep(0.3)
    assert counts(amqp_url, q, embedded_or_none)[1] == 10
    d.close()
    assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (10, 0))


def test_commit_acks_exactly_the_committed_batch(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(10)])
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=4, prefetch=10)
    try:
        wait_for(
            lambda: (
                d.runtime.latest_offset(d.start, 0) is not None
                and d.runtime.session
                and len(d.runtime.session.inbox) + len(d.runtime.buffer) >= 10
            )
        )
        start, end = d.plan(max_rows=4)
        d.run_batch(start, end)
        d.runtime.commit(end)  # Spark's commit of batch 0 (normally made before batch 1 runs)
        assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 6))
    finally:
        d.close()
    assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (6, 0))


def test_idle_latest_offset_acks_the_last_batch(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"x"] * 5)
    d = MicroBatchDriver(amqp_url, q)
    try:
        d.drain(5)
        # No commit() for the last batch: Spark never sends it while idle.
        d.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0), timeout=30)
    finally:
        d.close()


def test_partitions_of_an_empty_range_and_of_a_previous_run(amqp_url: str, names, caplog) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [])
    d = MicroBatchDriver(amqp_url, q)
    try:
        assert d.runtime.partitions(d.start, d.start) == []
        foreign = AmqpSourceOffset.from_json({"v": 1, "queues": {q: {"session": "earlier-run.1", "tag": 40}}}).to_json()
        with caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            assert d.runtime.partitions(d.start, foreign) == []
        assert "redeliver" in caplog.text
    finally:
        d.close()


def test_several_queues_share_a_batch(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q1, q2 = names.queue(), names.queue()
    publish(amqp_url, q1, [b"a%d" % i for i in range(20)])
    publish(amqp_url, q2, [b"b%d" % i for i in range(30)])
    d = MicroBatchDriver(amqp_url, f"{q1}, {q2}")
    try:
        rows = d.drain(50)
        assert collections.Counter(r["queue"] for r in rows) == {q1: 20, q2: 30}
        offset = AmqpSourceOffset.from_json(d.start)
        assert offset.position(q1).tag >= 1 and offset.position(q2).tag >= 1
        d.idle_until(lambda: counts(amqp_url, q1, embedded_or_none) == (0, 0) and counts(amqp_url, q2, embedded_or_none) == (0, 0))
    finally:
        d.close()


def test_missing_queue_is_a_clear_error(amqp_url: str) -> None:
    d = MicroBatchDriver(amqp_url, "test.no.such.queue")
    with pytest.raises(AmqpSourceError, match=r"queue 'test.no.such.queue'.*404"):
        d.runtime.ensure_started()
    d.close()


def test_wrong_password_is_a_clear_error(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [])
    d = MicroBatchDriver(amqp_url, q, password="not-the-password")
    with pytest.raises(AmqpSourceError, match="refused the login of user 'guest'") as info:
        d.runtime.ensure_started()
    assert "not-the-password" not in str(info.value)
    d.close()


def test_available_now_reads_what_was_there(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"before"] * 25)
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=10, prefetch=100)
    try:
        d.runtime.prepare_available_now()
        publish(amqp_url, q, [b"after"] * 5, declare=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            planned = d.plan(wait=3)
            if planned is None:
                break
            d.run_batch(*planned)
        assert _bodies(d.rows) == [b"before"] * 25
        assert wait_for(lambda: counts(amqp_url, q, embedded_or_none)[1] <= 5)
    finally:
        d.close()
    assert wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (5, 0))


def test_available_now_batches_are_full_while_the_broker_is_still_delivering(amqp_url: str, names, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Spark asks for the first batch the moment the consumer has subscribed: taking what had arrived by then
    made a batch of a few messages, and each batch costs Spark a fixed 0.3-0.5 s. Every batch but the last
    of a run is full."""
    # A broker that pauses longer than FILL_QUIET ends a batch early, as it should: on a CI machine 96% busy, RabbitMQ
    # 3.10 paused 0.1 s mid-window and made [1000, 74, 96, 1000, ...]. Here no pause is that long.
    monkeypatch.setattr(runtime_module, "FILL_QUIET", 10.0)
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(2500)])
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=1000, prefetch=2000)
    try:
        d.runtime.prepare_available_now()
        sizes = []
        while (planned := d.plan(wait=3)) is not None:
            sizes.append(len(d.run_batch(*planned)))
        assert sizes == [1000, 1000, 500]
    finally:
        d.close()


def test_available_now_reads_what_is_on_its_way_when_the_queue_reports_empty(amqp_url: str, names, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A queue reports nothing ready once it has handed its last messages to the consumer, which may not have read them
    yet on a loaded machine: a CI run on RabbitMQ 3.10 ended 195 messages of 2,500 short, and called itself done."""
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(30)])
    gate, measured = hold_deliveries_until_measured(monkeypatch, after=10)
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=10, prefetch=100)
    try:
        d.runtime.prepare_available_now()
        while (planned := d.plan(wait=3)) is not None:
            d.run_batch(*planned)
        assert measured and measured[0] == {q: 0}, measured  # the broker did report the queue empty
        assert _bodies(d.rows) == [b"m%d" % i for i in range(30)]
    finally:
        gate.set()
        d.close()


# -- failures: embedded broker only -------------------------------------------------


def _unique(rows: list[dict]) -> bool:  # type: ignore[type-arg]
    ids = [r["message_id"] for r in rows]
    return len(ids) == len(set(ids))


def test_connection_drop_with_a_planned_batch_loses_and_duplicates_nothing(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"m%d" % i for i in range(40)], message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=10, prefetch=40)
    try:
        start, end = d.plan(max_rows=10)
        d.run_batch(start, end)  # planned on the first session, not yet committed
        assert embedded.drop_connections() == 1
        rows = d.drain(40, max_rows=10)
        assert len(rows) == 40 and _unique(rows)
        d.idle_until(lambda: embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1})
        # At least the planned batch came back from the broker and was recognised.
        assert d.runtime.intake.copies_dropped >= 10
        assert len(d.rows) == 40
    finally:
        d.close()


def test_connection_drop_right_after_commit_duplicates_nothing(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"same"] * 30)  # identical bodies, no message id: multiset fingerprints
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=10, prefetch=30)
    try:
        wait_for(lambda: d.runtime.latest_offset(d.start, 0) is not None and len(d.runtime.buffer) + len(d.runtime.session.inbox) >= 30)  # type: ignore[union-attr]
        start, end = d.plan(max_rows=10)
        d.run_batch(start, end)
        embedded.hold_confirms()  # irrelevant to acks; keeps the broker otherwise unchanged
        d.runtime.commit(end)  # ack sent...
        embedded.drop_connections()  # ...and the connection cut before its proof arrives
        embedded.release_confirms()
        d.drain(30, max_rows=10)
        d.idle_until(lambda: embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1})
        assert len(d.rows) == 30
        d.idle_until(lambda: embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1})
    finally:
        d.close()


def test_a_consumer_timeout_cancel_with_slow_batches_loses_and_duplicates_nothing(
    amqp_url: str, names, embedded_or_none, broker_version, caplog
) -> None:  # type: ignore[no-untyped-def]
    # RabbitMQ 4.3 times out a quorum queue's consumer with basic.cancel on an open channel; the
    # source says so (not "the queue was deleted"), gives its deliveries back and subscribes again.
    # (3.10-4.2 close the channel with 406: test_channel_closed_by_broker_reopens_under_a_new_session.)
    if broker_version < (4, 3):
        pytest.skip("RabbitMQ 3.10-4.2 time consumers out by closing the channel, checked once a minute")
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-consumer-timeout": 1000})
    conn.close()
    publish(amqp_url, q, [b"m%d" % i for i in range(30)], declare=False, message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=10, prefetch=30)
    try:
        start, end = d.plan(max_rows=10)
        d.run_batch(start, end)
        with caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            # A long trigger interval: the batch's deliveries wait unacknowledged past the timeout.
            wait_for(lambda: "cancelled the consumer" in caplog.text, timeout=30)
            rows = d.drain(30, max_rows=10)
        assert "although the queue still exists" in caplog.text and "consumer timeout" in caplog.text
        assert "was deleted" not in caplog.text
        assert len(rows) == 30 and _unique(rows)
        # The session's end is taken with the inbox, which idling reads: wait for it too.
        d.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0) and d.runtime.intake.sessions_lost >= 1, timeout=30)
        assert len(d.rows) == 30
    finally:
        d.close()


def test_an_ack_read_after_the_consumer_timed_out_is_not_taken_as_proven(embedded: EmbeddedBroker) -> None:
    # RabbitMQ 4.3's consumer timeout can fire while a commit's ack is on the wire: the broker gives the
    # deliveries back, sends basic.cancel, then ignores the ack, and the ack's proof still arrives. A
    # proof taken after the cancel dropped the committed batch from the redelivery filter: its copies
    # came back and were emitted again (a CI run wrote id0-id9 twice).
    conn = pika.BlockingConnection(pika.URLParameters(embedded.url))
    conn.channel().queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    publish(embedded.url, "q", [b"m%d" % i for i in range(30)], declare=False, message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=10, prefetch=30)
    try:
        start, end = d.plan(max_rows=10)
        d.run_batch(start, end)
        embedded.call(lambda s: setattr(s.faults, "time_out_at_ack", 1))
        d.runtime.commit(end)
        d.idle_until(lambda: d.runtime.intake.sessions_lost == 1)  # the next batches come from the new session
        rows = d.drain(30, max_rows=10)
        assert embedded.call(lambda s: s.faults.time_out_at_ack) == 0  # the ack did meet the timeout
        assert len(rows) == 30 and _unique(rows)
        d.idle_until(lambda: embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1}, timeout=30)
        assert d.runtime.intake.copies_dropped >= 10
        assert len(d.rows) == 30
    finally:
        d.close()


def test_a_stopped_query_gives_its_deliveries_back_uncounted_on_4_3(amqp_url: str, names, embedded_or_none, broker_version) -> None:  # type: ignore[no-untyped-def]
    # Stopping a query closes its connection. To a quorum queue on RabbitMQ 4.3 a closed channel
    # is a return that counts towards the delivery-limit, a nack is not: the source nacks first.
    # (3.10 and 4.0 count both.)
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    publish(amqp_url, q, [b"m%d" % i for i in range(10)], declare=False, message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=5, prefetch=10)
    try:
        d.run_batch(*d.plan())  # a batch Spark has not committed, and five more prefetched
        wait_for(lambda: counts(amqp_url, q, embedded_or_none) == (0, 10), timeout=15)
    finally:
        d.close()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = consume_n(conn, ch, q, 10)
    conn.close()
    assert sorted(p.message_id for _, p, _ in got) == sorted(f"id-{i}" for i in range(10))
    expected = {"x-acquired-count": 1} if broker_version >= (4, 3) else {"x-delivery-count": 1}
    assert all(m.redelivered and p.headers == expected for m, p, _ in got), [p.headers for _, p, _ in got]


def test_channel_closed_by_broker_reopens_under_a_new_session(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"m%d" % i for i in range(20)], message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=5, prefetch=20)
    try:
        start, end = d.plan(max_rows=5)
        d.run_batch(start, end)
        assert embedded.close_channels(406, "PRECONDITION_FAILED - injected", queue="q") == 1
        rows = d.drain(20, max_rows=5)
        assert len(rows) == 20 and _unique(rows)
        d.idle_until(lambda: embedded.queue_stats("q") == {"ready": 0, "unacked": 0, "consumers": 1})
        assert d.runtime.intake.sessions_lost == 1
    finally:
        d.close()


def test_broker_refusing_connections_is_retried(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"m%d" % i for i in range(10)], message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q")
    try:
        d.runtime.ensure_started()
        embedded.refuse_connections(1.0)
        embedded.drop_connections()
        rows = d.drain(10)
        assert len(rows) == 10 and _unique(rows)
    finally:
        d.close()


def test_a_broker_gone_longer_than_broker_outage_timeout_fails_the_query_and_shows_meanwhile(embedded: EmbeddedBroker) -> None:
    """Before, a lost broker was waited out without end, the query showing an idle queue."""
    publish(embedded.url, "q", [b"m%d" % i for i in range(10)])
    d = MicroBatchDriver(embedded.url, "q", brokerOutageTimeout="3s", connectionTimeout="1")
    try:
        d.drain(10)
        embedded.refuse_connections(60.0)
        embedded.drop_connections()
        began = time.monotonic()
        assert wait_for(lambda: (d.runtime.backlog() or {}).get("outage") is not None, timeout=30)
        shown = d.runtime.backlog()["outage"]  # type: ignore[index]
        assert shown["attempts"] >= 1 and ("socket closed" in shown["lastError"] or "refused" in shown["lastError"]), shown
        with pytest.raises(AmqpSourceError, match=r"no answer from amqp://guest@127\.0\.0\.1:\d+/%2F for \d+s \(brokerOutageTimeout=3s\)"):
            while time.monotonic() - began < 20:
                d.runtime.latest_offset(d.start)  # Spark's calls while the broker is away
                time.sleep(0.05)
        assert time.monotonic() - began < 8
    finally:
        d.close()


def test_available_now_with_a_small_target_keeps_the_rest_unplanned_once(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"m%d" % i for i in range(12)], message_id=lambda i: f"id-{i}")
    d = MicroBatchDriver(embedded.url, "q", maxMessagesPerTrigger=5, prefetch=40)
    try:
        d.runtime.ensure_started()
        d.idle_until(lambda: len(d.runtime.buffer) == 12)
        d.runtime.available_now = AvailableNow({"q": 7}, d.runtime.options.connection, "test")
        while (planned := d.plan(max_rows=5, wait=0.3)) is not None:
            d.run_batch(*planned)
        assert [r["message_id"] for r in d.rows] == [f"id-{i}" for i in range(7)]
        assert [e.delivery.props.message_id for e in d.runtime.buffer] == [f"id-{i}" for i in range(7, 12)]
    finally:
        d.close()


def test_heartbeats_keep_an_idle_consumer_connected(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [])
    d = MicroBatchDriver(embedded.url, "q", heartbeat=1)
    try:
        d.runtime.ensure_started()
        deadline = time.monotonic() + 3.5
        d.idle_until(lambda: time.monotonic() > deadline, timeout=10)
        assert d.runtime.intake.sessions_lost == 0
        publish(embedded.url, "q", [b"late"], declare=False)
        assert [r["body"] for r in d.drain(1)] == [b"late"]
    finally:
        d.close()


def test_deleting_the_queue_under_the_stream_fails_it_clearly(embedded: EmbeddedBroker) -> None:
    publish(embedded.url, "q", [b"x"])
    d = MicroBatchDriver(embedded.url, "q")
    try:
        d.drain(1)
        conn = pika.BlockingConnection(pika.URLParameters(embedded.url))
        conn.channel().queue_delete("q")
        conn.close()
        with pytest.raises(AmqpSourceError, match=r"queue 'q'.*not found \(404"):
            d.idle_until(lambda: False, timeout=10)
    finally:
        d.close()


def test_lazy_properties_decode_like_pika() -> None:
    from pamqp import commands, header

    from spark_amqp.client import LazyProperties

    full = commands.Basic.Properties(
        content_type="text/plain",
        content_encoding="gzip",
        headers={"a": 1, "b": "two"},
        delivery_mode=2,
        priority=5,
        correlation_id="c",
        reply_to="r",
        expiration="1000",
        message_id="m",
        timestamp=datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        message_type="t",
        user_id="u",
        app_id="app",
    )
    raw = header.ContentHeader(0, 3, full).marshal()
    lazy = LazyProperties(raw)
    assert (lazy.content_type, lazy.type, lazy.timestamp, lazy.headers) == ("text/plain", "t", 1704153600, {"a": 1, "b": "two"})
    assert lazy.arrow_row() == ("m", "c", "text/plain", "gzip", "t", "app", "u", "r", "1000", 5, 2, 1704153600, {"a": 1, "b": "two"}, None)
    empty = LazyProperties(header.ContentHeader(0, 0, commands.Basic.Properties()).marshal())
    assert empty.message_id is None and empty.headers is None and empty.arrow_row() == (None,) * 14


def test_declare_and_bind_the_queue(amqp_url: str, names, embedded_or_none) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    d = MicroBatchDriver(
        amqp_url,
        q,
        declareQueue="true",
        queueDurable="false",
        queueArguments='{"x-max-length": 100}',
        bindExchange="amq.topic",
        bindingKey="orders.#",
    )
    try:
        d.runtime.ensure_started()
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "orders.eu", b"routed")
        ch.basic_publish("amq.topic", "refunds.eu", b"not routed")
        conn.close()
        assert [r["body"] for r in d.drain(1)] == [b"routed"]
        assert d.rows[0]["exchange"] == "amq.topic" and d.rows[0]["routing_key"] == "orders.eu"
    finally:
        d.close()


def blocks_sigterm(pid: int, tid: str) -> bool:
    with open(f"/proc/{pid}/task/{tid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("to", ["the process", "another thread"])
def test_sigterm_handler_closes_the_connection_cleanly(embedded: EmbeddedBroker, to: str) -> None:
    """What Spark's stop does to the source runner: SIGTERM while it waits on its control socket."""
    import ctypes
    import os
    import subprocess
    import sys
    import textwrap

    publish(embedded.url, "q", [b"m%d" % i for i in range(20)])
    script = textwrap.dedent(
        f"""
        import sys, time
        from spark_amqp.queues.options import parse_source_options
        from spark_amqp.queues.runtime import SourceRuntime
        runtime = SourceRuntime(parse_source_options({{"uri": {embedded.url!r}, "queue": "q"}}))
        runtime.ensure_started()
        from spark_amqp.queues.sigterm import shut_down_first
        shut_down_first(runtime.shutdown)
        runtime.latest_offset(None, None)  # plans a batch: 20 unacked, never committed
        print("ready", flush=True)
        sys.stdin.read()  # blocked like the runner on its socket
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert wait_for(lambda: embedded.queue_stats("q")["unacked"] == 20)
        if to == "another thread":
            # What the kernel may do with the process's signal (it did in a CI run): a thread that is not the main one
            # takes it, and Python's handler waits for the main thread, blocked in its read.
            other = next(tid for tid in os.listdir(f"/proc/{proc.pid}/task") if tid != str(proc.pid) and not blocks_sigterm(proc.pid, tid))
            assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, int(other), signal.SIGTERM) == 0
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == -signal.SIGTERM  # its shutdown is bounded at 10 s; a loaded machine takes longer
    finally:
        proc.kill()
    ended = [how for name, how in embedded.ended_connections() if name.startswith("spark-amqp source")]
    assert ended == ["closed by client"]
    assert embedded.queue_stats("q") == {"ready": 20, "unacked": 0, "consumers": 0}


def test_min_messages_per_trigger_holds_a_batch_back(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [])
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=100, minMessagesPerTrigger=50, maxTriggerDelay="1h")
    try:
        runtime = d.runtime
        runtime.ensure_started()
        runtime.admission.fired(time.monotonic())  # as if a batch had just run: the minimum applies
        publish(amqp_url, q, [b"early"] * 49, declare=False)

        def held_back() -> bool:
            assert runtime.latest_offset(d.start) == d.start, "a batch below minMessagesPerTrigger was planned"
            return len(runtime.buffer) == 49

        assert wait_for(held_back, timeout=30)
        assert runtime.latest_offset(d.start) == d.start
        publish(amqp_url, q, [b"enough"], declare=False)
        planned = d.plan(wait=30)
        assert planned is not None and len(d.run_batch(*planned)) == 50
    finally:
        d.close()
