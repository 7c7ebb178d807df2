"""Exactly-once with ``journalLocation``: replays from the journal, redelivered copies dropped, the journal kept small.

A "crash" here is a runtime abandoned without committing: its connection
closes, the broker requeues what it had not acknowledged, and a new runtime
(a restarted query) meets the same journal, driven the way Spark restarts.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from pathlib import Path

import pika
import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.queues.journal import BatchJournal

from ..broker.helpers import wait_for
from ..brokers import counts, drop_source_connections, publish
from .driver import MicroBatchDriver


def _ids(rows: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [r["message_id"] for r in rows]


def _journal_files(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.exists() else []


def _driver(url: str, queue: str, journal: Path, **options: object) -> MicroBatchDriver:
    return MicroBatchDriver(url, queue, journalLocation=str(journal), **options)


def _crash(d: MicroBatchDriver) -> None:
    d.close()  # no commit: to the broker this is a dead consumer, its deliveries are requeued


def _lose_acks(d: MicroBatchDriver) -> None:
    """The process dies before its acks leave: every message comes back, journalled ones too."""
    d.runtime.ensure_started()
    d.runtime.session.ack = lambda *args: None  # type: ignore[method-assign, union-attr]


def _purge(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_purge(queue)
    conn.close()


def _first_batch(url: str, queue: str, journal: Path, **options: object) -> tuple[MicroBatchDriver, dict, dict, list[dict]]:  # type: ignore[type-arg]
    """30 messages with ids published; a first run plans and runs its first batch (up to 10)."""
    publish(url, queue, [b"m%d" % i for i in range(30)], message_id=lambda i: f"id-{i}")
    first = _driver(url, queue, journal, maxMessagesPerTrigger=10, prefetch=30, **options)
    start, end = first.plan()
    return first, start, end, first.run_batch(start, end)


def _replay(d: MicroBatchDriver, start: dict, end: dict) -> list[dict]:  # type: ignore[type-arg]
    d.start = start
    return d.run_batch(start, end, commit_previous=False)


def test_replayed_batch_is_identical_and_its_redelivered_copies_are_dropped(amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    first, start, end, original = _first_batch(amqp_url, q, journal)
    # Up to 10: what had arrived when the batch was planned (fewer on a loaded machine).
    assert 0 < len(original) <= 10 and len(_journal_files(journal)) == 2  # data + manifest
    assert wait_for(lambda: sum(counts(amqp_url, q, embedded_or_none)) == 30 - len(original))  # the batch is acked already
    _crash(first)  # the sink wrote the batch; Spark had not yet logged the commit

    # Copies of the journalled batch may come back if its acks were lost: its entry waits for them
    # for journalRetention seconds (here the acks went through, so none come).
    second = _driver(amqp_url, q, journal, maxMessagesPerTrigger=10, prefetch=30, journalRetention=2)
    try:
        assert _replay(second, start, end) == original  # every column, including the original tags
        rest = second.drain(30)[len(original) :]
        assert sorted(_ids(original + rest)) == sorted(f"id-{i}" for i in range(30))
        assert second.runtime.intake.copies_dropped == 0  # acked when journalled: none came back
        second.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0) and not _journal_files(journal))
    finally:
        second.close()


def test_a_batch_journalled_but_never_logged_is_the_next_batch(amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    first, _, end, committed = _first_batch(amqp_url, q, journal)
    _, lost_end = first.plan()  # batch 2 journalled and acknowledged; the crash comes before Spark logs its offset
    lost = first.run_batch(end, lost_end)  # (what it holds)
    _crash(first)

    second = _driver(amqp_url, q, journal, maxMessagesPerTrigger=10, prefetch=30, journalRetention=2)
    try:
        second.start = end  # Spark resumes after the last logged (and committed) batch
        assert second.plan() == (end, lost_end)  # the same batch: its messages are only in the journal now
        assert second.run_batch(end, lost_end) == lost
        rest = second.drain(30 - len(committed))[len(lost) :]  # the first batch was committed before the crash
        assert sorted(_ids(committed + lost + rest)) == sorted(f"id-{i}" for i in range(30))
        second.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0) and not _journal_files(journal))
    finally:
        second.close()


def test_a_crash_between_the_journal_and_its_acks_drops_the_copies(amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    publish(amqp_url, q, [b"m%d" % i for i in range(30)], message_id=lambda i: f"id-{i}")
    first = _driver(amqp_url, q, journal, maxMessagesPerTrigger=10, prefetch=30)
    _lose_acks(first)
    start, end = first.plan()
    batch = first.run_batch(start, end)
    _crash(first)
    assert counts(amqp_url, q, embedded_or_none) == (30, 0)  # every message came back, the batch's too

    second = _driver(amqp_url, q, journal, maxMessagesPerTrigger=10, prefetch=30)
    try:
        assert _replay(second, start, end) == batch
        rest = second.drain(30)[len(batch) :]  # the batch is what had arrived when it was planned: up to 10
        assert sorted(_ids(batch + rest)) == sorted(f"id-{i}" for i in range(30))
        assert second.runtime.intake.copies_dropped == len(batch)
        second.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0) and not _journal_files(journal))
    finally:
        second.close()


def test_content_fingerprints_count_identical_messages(amqp_url: str, names, embedded_or_none, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q, journal = names.queue(), tmp_path / "journal"
    bodies = [b"same"] * 12 + [b"m%d" % i for i in range(8)]  # no message ids: twelve identical messages
    publish(amqp_url, q, bodies)
    first = _driver(amqp_url, q, journal, maxMessagesPerTrigger=7, prefetch=20, dedupeBy="content")
    start, end = first.plan()
    original = first.run_batch(start, end)
    _crash(first)

    second = _driver(amqp_url, q, journal, maxMessagesPerTrigger=7, prefetch=20, dedupeBy="content")
    try:
        assert _replay(second, start, end) == original
        rows = second.drain(20)
        assert collections.Counter(r["body"] for r in rows) == collections.Counter(bodies)
        second.idle_until(lambda: counts(amqp_url, q, embedded_or_none) == (0, 0))
    finally:
        second.close()


def test_message_ids_dedupe_even_if_content_differs(embedded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """dedupeBy=messageId (the default): the id is the message's identity, whatever else changes."""
    journal = tmp_path / "journal"
    publish(embedded.url, "q", [b"a", b"b"], message_id=lambda i: f"id-{i}")
    first = _driver(embedded.url, "q", journal)
    _lose_acks(first)
    start, end = first.plan()
    first.run_batch(start, end)
    _crash(first)
    second = _driver(embedded.url, "q", journal)
    try:
        _replay(second, start, end)
        second.idle_until(lambda: counts(embedded.url, "q", embedded) == (0, 0))
        assert second.runtime.intake.copies_dropped == 2 and second.plan(wait=0.3) is None
    finally:
        second.close()


def test_a_new_checkpoint_reads_the_uncommitted_batch_of_the_old_journal(embedded, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal"
    publish(embedded.url, "q", [b"m%d" % i for i in range(10)], message_id=lambda i: f"id-{i}")
    first = _driver(embedded.url, "q", journal, maxMessagesPerTrigger=5, prefetch=10)
    start, end = first.plan()
    done = first.run_batch(start, end)
    first.plan()  # batch 2 journalled and acknowledged, never committed
    wait_for(lambda: first.runtime.commit(end) or len(_journal_files(journal)) == 2)  # batch 1 committed: its entry goes
    _crash(first)
    fresh = _driver(embedded.url, "q", journal, maxMessagesPerTrigger=5, prefetch=10, journalRetention=2)  # a new checkpoint
    try:
        with caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            rows = fresh.drain(5)
        # Batch 2's messages are only in the journal: read again; batch 1's are not.
        assert sorted(_ids(done + rows)) == [f"id-{i}" for i in range(10)]
        assert "no checkpoint is known to have committed" in caplog.text
        fresh.idle_until(lambda: counts(embedded.url, "q", embedded) == (0, 0) and not _journal_files(journal))
        assert fresh.plan(wait=0.3) is None
    finally:
        fresh.close()


def test_acks_maybe_lost_content_copies_come_out_again_never_lost(embedded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Identical content cannot be told apart once acks may have been sent: such copies are emitted again."""
    journal = tmp_path / "journal"
    publish(embedded.url, "q", [b"x", b"y"])
    first = _driver(embedded.url, "q", journal, dedupeBy="content")
    _lose_acks(first)
    start, end = first.plan()
    first.run_batch(start, end)
    _crash(first)
    second = _driver(embedded.url, "q", journal, dedupeBy="content")
    try:
        second.start = end
        assert sorted(r["body"] for r in second.drain(2)) == [b"x", b"y"]  # at least once
    finally:
        second.close()


def test_copies_that_never_come_back_expire_after_the_retention(embedded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal"
    publish(embedded.url, "q", [b"m"], message_id="only")
    first = _driver(embedded.url, "q", journal)
    start, end = first.plan()
    first.run_batch(start, end)
    _crash(first)
    _purge(embedded.url, "q")  # the copies the journal expects are gone (as if their ack had been processed)
    second = _driver(embedded.url, "q", journal, journalRetention=1)
    try:
        second.start = end
        second.idle_until(lambda: not _journal_files(journal), timeout=30)
    finally:
        second.close()


def test_a_journal_of_other_queues_is_refused(embedded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal"
    publish(embedded.url, "a", [b"m"])
    publish(embedded.url, "b", [b"m"])
    first = _driver(embedded.url, "a", journal)
    _, end = first.plan()
    _crash(first)
    other = _driver(embedded.url, "b", journal)
    try:
        with pytest.raises(AmqpSourceError, match="give every query its own journal"):
            other.runtime.latest_offset(end, None)
    finally:
        other.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_second_exactly_once_query_fails_fast_and_the_first_goes_on(
    amqp_url: str, names, embedded_or_none, tmp_path: Path, queue_type: str
) -> None:  # type: ignore[no-untyped-def]
    # Every RabbitMQ line (and the embedded broker) accepts a second consumer on a quorum queue
    # however exclusive: the source counts consumers after subscribing. On a classic queue the
    # exclusive basic.consume is refused (403).
    q = names.queue()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": queue_type})
    conn.close()
    publish(amqp_url, q, [b"m%d" % i for i in range(30)], declare=False, message_id=lambda i: f"id-{i}")
    first = _driver(amqp_url, q, tmp_path / "one", maxMessagesPerTrigger=5, prefetch=10)
    try:
        first.run_batch(*first.plan())
        for attempt in ("while the first runs", "after the first reconnected"):
            if attempt.startswith("after"):
                assert drop_source_connections(amqp_url, embedded_or_none, f"spark-amqp source {first.runtime.run_id}") == 1

                def consuming_again() -> bool:  # deliveries came on a channel of the new connection
                    first.drain(len(first.rows) + 1, timeout=0.5)
                    return any(not session.endswith(".1") for session in first.runtime.ledgers)

                wait_for(consuming_again, timeout=30)
            second = _driver(amqp_url, q, tmp_path / "two", maxMessagesPerTrigger=5, prefetch=10)
            began = time.monotonic()
            try:
                with pytest.raises(AmqpSourceError) as info:
                    second.plan(wait=30)
            finally:
                second.close()
            assert time.monotonic() - began < 15, attempt  # within seconds, not after a retry period
            message = str(info.value)
            assert "one streaming query per queue" in message and "rabbitmqctl list_consumers" in message, message
            if queue_type == "quorum":
                assert f"queue '{q}'" in message and "has another consumer: 2 consumers" in message, message
        ids = _ids(first.drain(30))
        assert sorted(ids) == sorted(f"id-{i}" for i in range(30)), collections.Counter(ids).most_common(3)
        assert first.runtime.session is not None and first.runtime.session.fatal is None
    finally:
        first.close()


# -- the journal's files ------------------------------------------------------------------


def _parts(*values: bytes) -> list[bytes]:
    return [b"ipc:" + v for v in values]  # the journal stores partitions' bytes as they are


def test_journal_round_trip_and_numbering_across_runs(tmp_path: Path) -> None:
    one = BatchJournal(str(tmp_path), "j")
    a = one.write("s0", "s1", _parts(b"a", b"bb"), {"q": [("id", "1"), ("fp", "ab")]})
    b = one.write("s1", "s2", _parts(b"c"), {"q": [("id", "2")]})
    two = BatchJournal(f"file://{tmp_path}", "j")
    loaded = two.load()
    assert [(e.number, e.start, e.end, e.rows, e.acking, e.committed) for e in loaded] == [
        (1, "s0", "s1", 2, True, False),
        (2, "s1", "s2", 1, True, False),
    ]
    assert two.parts(loaded[0]) == _parts(b"a", b"bb") and loaded[0].fingerprints == a.fingerprints
    assert two.write("s2", "s3", _parts(b"d"), {}).number == 3  # numbers keep growing: manifests sort in planning order
    two.mark_committed(loaded[1])
    assert [e.committed for e in BatchJournal(str(tmp_path), "j").load()] == [False, True, False]
    two.restart_from(loaded[0], "s9")  # a batch planned again from another start keeps everything else
    first = BatchJournal(str(tmp_path), "j").load()[0]
    assert (first.start, first.end, first.rows) == ("s9", "s1", 2)
    two.delete(b)
    assert sorted(os.listdir(tmp_path)) == [
        "batch-000000000001.arrows",
        "batch-000000000001.json",
        "batch-000000000003.arrows",
        "batch-000000000003.json",
    ]


def test_a_version_1_journal_is_read(tmp_path: Path) -> None:
    manifest = {"v": 1, "start": "s0", "end": "s1", "parts": [2], "fingerprints": {"q": [["id", "1"]]}, "written": 0}
    (tmp_path / "batch-000000000004.json").write_text(json.dumps(manifest))
    (tmp_path / "batch-000000000004.arrows").write_bytes(b"ab")
    (tmp_path / "batch-000000000005.json").write_text(json.dumps({**manifest, "start": "s1", "end": "s2"}))
    (tmp_path / "batch-000000000005.arrows").write_bytes(b"cd")
    (tmp_path / "batch-000000000005.acking").write_bytes(b"")
    journal = BatchJournal(str(tmp_path), "j")
    assert [(e.number, e.acking) for e in journal.load()] == [(4, False), (5, True)]
    assert journal.write("s2", "s3", [b"e"], {}).number == 6


@pytest.mark.parametrize("failing", [".arrows", ".json", ".committed"])
def test_a_journal_that_cannot_be_written_is_a_clear_error(tmp_path: Path, failing: str) -> None:
    journal = BatchJournal(str(tmp_path), "journal-at-j")
    entry = journal.write("s0", "s1", _parts(b"a"), {"q": [("id", "1")]}) if failing == ".committed" else None
    put = journal.store.put

    def refuse(name: str, data: bytes) -> None:
        if name.endswith(failing):
            raise OSError(28, "No space left on device")
        put(name, data)

    journal.store.put = refuse  # type: ignore[method-assign]
    with pytest.raises(AmqpSourceError, match=r"cannot write the batch journal at journal-at-j: .*No space left on device"):
        if entry is not None:
            journal.mark_committed(entry)
        else:
            journal.write("s0", "s1", _parts(b"a"), {"q": [("id", "1")]})


def test_an_interrupted_write_is_not_a_batch(tmp_path: Path) -> None:
    (tmp_path / "batch-000000000007.arrows").write_bytes(b"partial")  # crashed before the manifest
    (tmp_path / "batch-000000000007.json.tmp").write_bytes(b"{")
    assert BatchJournal(str(tmp_path), "j").load() == []
    assert os.listdir(tmp_path) == []


def test_a_damaged_journal_is_a_clear_error(tmp_path: Path) -> None:
    journal = BatchJournal(str(tmp_path), "j")
    entry = journal.write("s0", "s1", _parts(b"a"), {"q": [("id", "1")]})
    (tmp_path / "batch-000000000001.arrows").write_bytes(b"cut")
    with pytest.raises(AmqpSourceError, match="modified or truncated"):
        journal.parts(entry)
    (tmp_path / "batch-000000000001.json").write_text(json.dumps({"v": 99}))
    with pytest.raises(AmqpSourceError, match="not a journal manifest"):
        journal.load()


def test_options_for_exactly_once() -> None:
    from spark_amqp.errors import AmqpOptionError
    from spark_amqp.queues.options import parse_source_options

    base = {"uri": "amqp://h", "queue": "q"}
    opts = parse_source_options({**base, "journalLocation": "/tmp/j"})
    assert opts.journal is not None and opts.journal.retention == 1800 and opts.exclusive_consumer and opts.dedupe_by == "messageId"
    assert not parse_source_options(base).exclusive_consumer
    assert parse_source_options({**base, "dedupeby": "CONTENT"}).dedupe_by == "content"
    with pytest.raises(AmqpOptionError, match="'dedupeBy' must be messageId or content"):
        parse_source_options({**base, "dedupeBy": "hash"})
    with pytest.raises(AmqpOptionError, match="'journalRetention' only applies with option 'journalLocation'"):
        parse_source_options({**base, "journalRetention": "60"})
    with pytest.raises(AmqpOptionError, match="'journalLocation' is empty"):
        parse_source_options({**base, "journalLocation": " "})
    secret = parse_source_options({**base, "journalLocation": "s3://key:secret@bucket/j"})
    assert secret.journal is not None and "secret" not in secret.journal.display_location


def test_classify_against_sparks_offsets() -> None:
    from dataclasses import replace

    from spark_amqp.queues.journal import JournalEntry, classify

    def offset(tag: int) -> str:
        return json.dumps({"queues": {"q": {"session": "s" if tag else "", "tag": tag}}, "v": 1}, sort_keys=True, separators=(",", ":"))

    a, b, c, d = (JournalEntry(n, offset(n - 1), offset(n), (1,), {"q": (("id", str(n)),)}, True) for n in (1, 2, 3, 4))
    resumed = classify([a, b, c, d], frontier=offset(2), replay=None, initial=offset(0), display="j")
    assert (resumed.committed, resumed.replayed, resumed.pending, resumed.discard) == ([a, b], None, [c, d], [])
    replaying = classify([a, b, c], frontier=offset(1), replay=offset(2), initial=offset(0), display="j")
    assert (replaying.committed, replaying.replayed, replaying.pending) == ([a], b, [c])
    # Spark starts from scratch (a new checkpoint): what is not known to be committed is read again.
    fresh = classify([replace(a, committed=True), b, c], frontier=offset(0), replay=None, initial=offset(0), display="j")
    assert fresh.stale and fresh.pending == [b, c] and fresh.discard == [replace(a, committed=True)] and not fresh.committed
    # A version 1 journal planned again from a lost batch's start: the later plan is the one Spark got.
    again = JournalEntry(5, offset(2), offset(9), (1,), {"q": (("id", "9"),)})
    redone = classify([a, b, c, again], frontier=offset(2), replay=None, initial=offset(0), display="j")
    assert (redone.pending, redone.discard) == ([again], [c])
    with pytest.raises(AmqpSourceError, match="give every query its own journal"):
        classify([a], frontier=offset(1), replay=None, initial=offset(0).replace('"q"', '"other"'), display="j")


def test_exclusive_conflict_after_a_reconnect_is_waited_out(embedded, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Our previous consumer may linger on the broker after a reconnect: retry instead of failing the query."""
    publish(embedded.url, "q", [b"m%d" % i for i in range(5)], message_id=lambda i: f"id-{i}")
    d = _driver(embedded.url, "q", tmp_path / "journal")
    other = pika.BlockingConnection(pika.URLParameters(embedded.url))
    try:
        start, end = d.plan()
        d.run_batch(start, end)
        assert embedded.drop_connections(name_contains="spark-amqp source") == 1
        # Take the queue exclusively before the source comes back (it waits 0.2 s).
        channel = other.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("q", lambda *a: None, exclusive=True)
        with caplog.at_level(logging.WARNING, logger="spark_amqp.queues"):
            wait_for(lambda: "still has another consumer" in caplog.text, timeout=10)
        d.runtime.latest_offset(end, 0)  # not fatal
        other.close()  # the other consumer goes: its unacked message returns, the source resumes
        publish(embedded.url, "q", [b"n%d" % i for i in range(5, 10)], declare=False, message_id=lambda i: f"id-{i + 5}")
        assert sorted(_ids(d.drain(10))) == sorted(f"id-{i}" for i in range(10))  # the batch's copies dropped
        assert d.runtime.session is not None and d.runtime.session.fatal is None
    finally:
        if other.is_open:
            other.close()
        d.close()


def test_journal_on_a_pyarrow_filesystem(tmp_path: Path) -> None:
    """Object stores go through pyarrow's filesystem API (no rename); the same files result."""
    import pyarrow.fs as pafs

    from spark_amqp.queues.journal import _ArrowStore

    journal = BatchJournal(str(tmp_path / "unused"), "j")
    journal.store = _ArrowStore(pafs.LocalFileSystem(), str(tmp_path / "remote"))
    entry = journal.write("s0", "s1", _parts(b"a", b"b"), {"q": [("id", "1"), ("id", "2")]})
    journal.mark_committed(entry)
    (loaded,) = journal.load()
    assert loaded.acking and loaded.committed and journal.parts(loaded) == _parts(b"a", b"b")
    journal.delete(loaded)
    assert journal.load() == [] and os.listdir(tmp_path / "remote") == []


def test_an_unknown_journal_filesystem_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AmqpSourceError, match=r"option 'journalLocation'.*nosuchfs://"):
        BatchJournal("nosuchfs://bucket/journal", "nosuchfs://bucket/journal")
