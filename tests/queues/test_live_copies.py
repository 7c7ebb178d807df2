"""Copies a quorum queue sends again on a channel that is still open (a partition of the consumer's node: see
``spark_amqp.queues.copies``), with a journal: each message goes into one batch, and every tag is acked. No broker:
the session is a fake that records acks; ``tests/cluster/test_partition.py`` shows it on a real cluster."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pika
import pyarrow as pa

from spark_amqp.queues.inbox import AckConfirmed, Delivery, SessionClosed
from spark_amqp.queues.intake import Intake
from spark_amqp.queues.ledger import SUPERSEDED, Entry, RedeliveryFilter, fingerprint
from spark_amqp.queues.options import parse_source_options
from spark_amqp.queues.runtime import SourceRuntime
from spark_amqp.reading import arrow


def _d(tag: int, mid: str, redelivered: bool = False, session: str = "s.1") -> Delivery:
    return Delivery(session, "q", tag, redelivered, "", "q", pika.BasicProperties(message_id=mid), mid.encode())


class FakeSession:
    marks_redeliveries = True
    server_version = (4, 3, 6)

    def __init__(self) -> None:
        self.inbox: collections.deque[Any] = collections.deque()
        self.acked: dict[str, set[int]] = collections.defaultdict(set)  # tags each session acked, multi-acks spelled out
        self.rounds: list[tuple[str, int]] = []
        self.sent: dict[str, list[int]] = collections.defaultdict(list)

    def deliver(self, session: str, mids: list[str], redelivered: bool = False) -> None:
        for mid in mids:
            tag = len(self.sent[session]) + 1
            self.sent[session].append(tag)
            self.inbox.append(_d(tag, mid, redelivered, session))

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
                rows.extend(r["message_id"] for r in pa.Table.from_batches([b]).to_pylist())
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
