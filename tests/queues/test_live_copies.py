"""Copies a quorum queue sends again on a channel that is still open (a partition of the consumer's node: see
``spark_amqp.queues.copies``), with a journal: each message goes into one batch, and every tag is acked. Most tests
need no broker: the session is a fake that records acks. The last ones run on the embedded broker, whose
``redeliver_unacked`` sends a queue's unacknowledged deliveries again as the quorum queue does after the partition;
``tests/cluster/test_partition.py`` shows it on a real cluster."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pika
import pyarrow as pa
import pytest
from spark_amqp_broker import EmbeddedBroker

from spark_amqp.queues.inbox import AckConfirmed, Delivery, SessionClosed
from spark_amqp.queues.intake import Intake
from spark_amqp.queues.ledger import SUPERSEDED, Entry, RedeliveryFilter, fingerprint
from spark_amqp.queues.options import parse_source_options
from spark_amqp.queues.runtime import SourceRuntime
from spark_amqp.reading import arrow

from ..broker.helpers import wait_for
from ..brokers import counts, publish
from .driver import MicroBatchDriver


def _d(tag: int, mid: str, redelivered: bool = False, session: str = "s.1", ids: bool = True) -> Delivery:
    return Delivery(session, "q", tag, redelivered, "", "q", pika.BasicProperties(message_id=mid if ids else None), mid.encode())


class FakeSession:
    marks_redeliveries = True
    server_version = (4, 3, 6)

    def __init__(self) -> None:
        self.inbox: collections.deque[Any] = collections.deque()
        self.acked: dict[str, set[int]] = collections.defaultdict(set)  # tags each session acked, multi-acks spelled out
        self.rounds: list[tuple[str, int]] = []
        self.sent: dict[str, list[int]] = collections.defaultdict(list)

    def deliver(self, session: str, mids: list[str], redelivered: bool = False, ids: bool = True) -> None:
        """``ids``: the messages carry ``mids`` as message ids, not only as bodies."""
        for mid in mids:
            tag = len(self.sent[session]) + 1
            self.sent[session].append(tag)
            self.inbox.append(_d(tag, mid, redelivered, session, ids))

    def ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        if multiple is not None:
            self.acked[session].update(range(1, multiple + 1))
        self.acked[session].update(singles)
        self.rounds.append((session, ack_round))

    def prove(self) -> None:
        """The channel answers a sync method after every ack so far: proven, which the queue need not have applied."""
        for session, ack_round in self.rounds:
            self.inbox.append(AckConfirmed(session, ack_round))
        self.rounds.clear()

    def check(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Reader:
    def __init__(self, tmp_path: Path, **options: str) -> None:
        opts = {"uri": "amqp://h/", "queue": "q", "journalLocation": str(tmp_path / "journal"), **options}
        self.runtime = SourceRuntime(parse_source_options(opts))
        self.session = FakeSession()
        self.runtime.session = self.session  # type: ignore[assignment]
        self.start = self.runtime.last_end.to_json()
        self.rows: list[str] = []

    def batch(self) -> list[str]:
        end = self.runtime.latest_offset(self.start)
        rows: list[str] = []
        for data in self.runtime.partitions(self.start, end):
            for b in arrow.from_ipc(data):
                rows.extend(r["message_id"] or r["body"].decode() for r in pa.Table.from_batches([b]).to_pylist())
        self.runtime.commit(end)
        self.start = end
        self.rows.extend(rows)
        return rows


def test_acked_messages_sent_again_on_the_same_channel_are_dropped_and_acked(tmp_path: Path) -> None:
    reader = Reader(tmp_path, maxMessagesPerTrigger="5", prefetch="10")
    fake = reader.session
    fake.deliver("s.1", [f"m{i}" for i in range(5)])
    assert reader.batch() == [f"m{i}" for i in range(5)]
    fake.prove()
    assert reader.batch() == []
    # The partition heals: the queue had not applied the acks and sends the five again, marked redelivered.
    fake.deliver("s.1", [f"m{i}" for i in range(5)], redelivered=True)
    fake.deliver("s.1", ["m5"])
    assert reader.batch() == ["m5"]
    assert reader.runtime.intake.copies_dropped == 5
    assert fake.acked["s.1"] == set(range(1, 12))  # the copies' tags too: the queue keeps nothing checked out


def test_a_copy_of_a_message_still_in_the_buffer_takes_its_place(tmp_path: Path) -> None:
    reader = Reader(tmp_path, maxMessagesPerTrigger="3", prefetch="10")
    fake = reader.session
    fake.deliver("s.1", [f"m{i}" for i in range(6)])
    assert reader.batch() == ["m0", "m1", "m2"]
    fake.prove()
    # m3-m5 wait in the buffer when the queue returns all six; they come again under tags 7-12.
    fake.deliver("s.1", [f"m{i}" for i in range(6)], redelivered=True)
    assert reader.batch() == ["m3", "m4", "m5"]
    fake.prove()
    assert reader.batch() == []
    originals = [e for e in reader.runtime.ledgers["s.1"].recent if e.owner == SUPERSEDED]
    assert [e.tag for e in originals] == [4, 5, 6]  # acked with the frontier: the broker ignores them
    assert fake.acked["s.1"] == set(range(1, 13))
    assert sorted(reader.rows) == [f"m{i}" for i in range(6)]
    # Seen in CI: a second partition makes the queue return all six again, the first one's copies read and acked in
    # between among them; they came out a second time (400 ids read twice). Each copy found stands in for its original.
    fake.deliver("s.1", [f"m{i}" for i in range(6)], redelivered=True)  # tags 13-18
    fake.deliver("s.1", ["m6"])
    assert reader.batch() == ["m6"]
    fake.prove()
    assert reader.batch() == []
    assert sorted(reader.rows) == [f"m{i}" for i in range(7)]
    assert reader.runtime.intake.copies_dropped == 3 + 3 + 6
    assert fake.acked["s.1"] == set(range(1, 20))  # every tag: the queue keeps nothing checked out


def test_proven_acks_are_expected_back_when_the_channel_ends_too(tmp_path: Path) -> None:
    reader = Reader(tmp_path, maxMessagesPerTrigger="4", prefetch="8")
    fake = reader.session
    fake.deliver("s.1", [f"m{i}" for i in range(4)])
    assert len(reader.batch()) == 4
    fake.prove()
    reader.batch()
    fake.inbox.append(SessionClosed("s.1", "q", "connection lost"))
    fake.deliver("s.2", [f"m{i}" for i in range(4)], redelivered=True)
    fake.deliver("s.2", ["m4"])
    assert reader.batch() == ["m4"]
    assert fake.acked["s.2"] == {1, 2, 3, 4, 5}
    # A partition then makes the queue return them all on the new, live channel: the copies the redelivery filter
    # found there stand in for their originals (they have message ids), so none comes out again.
    fake.prove()
    fake.deliver("s.2", [f"m{i}" for i in range(5)], redelivered=True)
    assert reader.batch() == []
    assert sorted(reader.rows) == [f"m{i}" for i in range(5)]
    assert fake.acked["s.2"] == set(range(1, 11))


def test_returns_of_one_content_stay_two_and_are_copies_when_the_queue_sends_them_again(tmp_path: Path) -> None:
    # No ids. The channel ends with one "same" in a batch and two waiting; all four come back on the next one (the
    # batch's acks were not applied). The filter's counts decide: two returns pass, two copies are dropped, and a
    # return that passed is not taken for a copy of the other.
    reader = Reader(tmp_path, maxMessagesPerTrigger="2", prefetch="10")
    fake = reader.session
    fake.deliver("s.1", ["same", "m1", "same", "same"], ids=False)
    assert reader.batch() == ["same", "m1"]
    fake.inbox.append(SessionClosed("s.1", "q", "connection lost"))
    fake.deliver("s.2", ["same", "m1", "same", "same"], redelivered=True, ids=False)
    assert reader.batch() == ["same", "same"]
    fake.prove()
    assert reader.batch() == []
    # A partition: the queue sends all four again on the live channel, then a new message of the same content.
    fake.deliver("s.2", ["same", "m1", "same", "same"], redelivered=True, ids=False)
    fake.deliver("s.2", ["same"], ids=False)
    assert reader.batch() == ["same"]
    fake.prove()
    assert reader.batch() == []
    assert collections.Counter(reader.rows) == {"same": 4, "m1": 1}
    assert reader.runtime.intake.copies_dropped == 2 + 4
    assert fake.acked["s.2"] == set(range(1, 10))


def test_returns_from_before_the_run_are_originals_once_the_queue_sent_something_new(tmp_path: Path) -> None:
    # A restarted run's first channel gets back two messages of one content (no ids) that the journal knows nothing
    # of: two messages, both read. Once the queue has sent a first delivery, every return from before the run has
    # come: when a partition makes the queue send all three again, they are copies.
    reader = Reader(tmp_path, maxMessagesPerTrigger="5", prefetch="10")
    fake = reader.session
    fake.deliver("s.1", ["same", "same"], redelivered=True, ids=False)
    assert reader.batch() == ["same", "same"]
    fake.deliver("s.1", ["new"], ids=False)
    assert reader.batch() == ["new"]
    fake.prove()
    fake.deliver("s.1", ["same", "same", "new"], redelivered=True, ids=False)
    assert reader.batch() == []
    assert reader.runtime.intake.copies_dropped == 3 and fake.acked["s.1"] == set(range(1, 7))


def test_only_the_last_prefetch_window_of_proven_acks_is_kept() -> None:
    intake = Intake(RedeliveryFilter(), window=4)
    inbox: collections.deque[Any] = collections.deque(_d(t, f"m{t}") for t in range(1, 11))
    intake.take(inbox)
    ledger = intake.ledgers["s.1"]
    intake.claim(list(intake.buffer), 1)
    intake.buffer.clear()
    acks = ledger.next_acks(1, singles=True)
    assert acks is not None
    ledger.confirmed(acks.round)
    assert [e.tag for e in ledger.recent] == [7, 8, 9, 10]
    # A copy of one that left the window is new to the reader (the queue cannot have had it checked out).
    inbox.extend([_d(11, "m1", redelivered=True), _d(12, "m9", redelivered=True)])
    intake.take(inbox)
    assert [e.delivery.props.message_id for e in intake.buffer] == ["m1"] and intake.copies_dropped == 1


def test_without_a_journal_copies_on_a_live_channel_are_not_looked_up() -> None:
    # Without a journal the consumer is not exclusive: another application's return of a message could look like a copy.
    intake = Intake(RedeliveryFilter())
    inbox: collections.deque[Any] = collections.deque([_d(1, "m1")])
    intake.take(inbox)
    entry: Entry = intake.buffer.popleft()
    intake.claim([entry], 1)
    acks = intake.ledgers["s.1"].next_acks(1)
    assert acks is not None
    intake.ledgers["s.1"].confirmed(acks.round)
    inbox.append(_d(2, "m1", redelivered=True))
    intake.take(inbox)
    assert len(intake.buffer) == 1 and intake.copies_dropped == 0


def test_a_copy_without_an_id_found_by_the_filter_is_not_taken_for_another_message_of_the_same_content() -> None:
    # After a crash every delivery of the new channel is redelivered: the one the journal expects back is dropped,
    # and another message of the same content and no id, unknown to the journal, must come out.
    def same(tag: int) -> Delivery:
        return Delivery("s.2", "q", tag, True, "", "q", pika.BasicProperties(), b"same body")

    intake = Intake(RedeliveryFilter(), window=10)
    intake.filter.expect([(("q", fingerprint(same(0))), 1)])  # as restored from the journal: batch 1 holds one
    inbox: collections.deque[Any] = collections.deque([same(1), same(2)])
    intake.take(inbox)
    assert intake.copies_dropped == 1 and [e.tag for e in intake.buffer] == [2]


@pytest.mark.parametrize("ids", [False, True], ids=["no-ids", "ids"])
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_copy_found_after_a_lost_connection_is_found_again_when_the_queue_sends_it_once_more(
    embedded: EmbeddedBroker, tmp_path: Path, queue_type: str, ids: bool
) -> None:
    """The connection is lost with a batch planned and three messages waiting: the new channel gets all six again,
    the batch's three are copies the redelivery filter finds and the other three are new; then the queue sends all six
    again on that channel. Three share one content: without ids, two messages of one content stay two."""
    bodies = [b"same", b"m1", b"same", b"m3", b"same", b"m5"]
    conn = pika.BlockingConnection(pika.URLParameters(embedded.url))
    conn.channel().queue_declare("q", durable=True, arguments={"x-queue-type": queue_type})
    conn.close()
    publish(embedded.url, "q", bodies, declare=False, **({"message_id": lambda i: f"id-{i}"} if ids else {}))
    d = MicroBatchDriver(embedded.url, "q", journalLocation=str(tmp_path / "journal"), maxMessagesPerTrigger=3, prefetch=10)
    try:
        d.runtime.ensure_started()
        session = d.runtime.session
        assert session is not None
        session.ack = lambda *args: None  # type: ignore[method-assign]  # the acks the queue never applied
        wait_for(lambda: len(session.inbox) == 6, timeout=30)
        assert [r["body"] for r in d.run_batch(*d.plan())] == bodies[:3]  # type: ignore[misc]
        assert embedded.drop_connections(name_contains="spark-amqp source") == 1

        def pump(max_rows: int | None = None) -> int:  # plans and reads what came; how many the new channel delivered
            d.drain(len(d.rows) + 1, max_rows, timeout=0.2)
            return sum(len(ledger) for sid, ledger in d.runtime.ledgers.items() if not sid.endswith(".1"))

        # The loss is seen before the three waiting are planned (a quorum queue's counted returns are planned at once).
        wait_for(lambda: pump(max_rows=0) >= 0 and d.runtime.intake.sessions_lost, timeout=30)
        wait_for(lambda: pump() == 6, timeout=30)
        assert d.runtime.intake.copies_dropped == 3 and counts(embedded.url, "q", embedded) == (0, 6)
        assert embedded.redeliver_unacked("q") == 6
        wait_for(lambda: pump() == 12, timeout=30)
        pump()  # whatever the last deliveries left in the buffer is read too
        out = collections.Counter(r["body"] for r in d.rows)
        assert out == collections.Counter(bodies), f"read {sorted(out.elements())}"
        assert d.runtime.intake.copies_dropped == 3 + 6
    finally:
        d.close()
