"""``JournalledBatches``: what the source runtime knows about its batch journal.

With a journal the journal, not the queue, keeps a batch's messages from the
moment its entry is written: the runtime acknowledges them right away. So a
crash, a restart or a dropped connection never hands RabbitMQ back a message
that a batch holds, and a quorum queue's delivery-limit cannot drop it however
often the query fails. Which of this run's batch numbers have an entry, which
entries a restart must serve again, and when an entry can go are decided here.
Batches found in the journal at start-up get batch numbers in this run too, so
that redelivered copies of their messages are acknowledged the same way as any
other batch's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

from .journal import BatchJournal, JournalEntry, classify
from .ledger import Entry, Fingerprint, RedeliveryFilter, SessionLedger, fingerprint
from .offset import AmqpSourceOffset
from .options import JournalOptions

log = logging.getLogger("spark_amqp.queues")

RETIRE_INTERVAL = 0.2  # seconds between scans for deletable entries, unless an ack was just proven


class Journalled(NamedTuple):
    """A batch read back from the journal: its number in this run, offsets, partitions and rows."""

    seq: int
    start: str
    end: str
    parts: list[bytes]
    rows: int


class Recovered(NamedTuple):
    next_seq: int
    committed_seq: int | None  # the highest batch number given to an already committed batch
    replay: Journalled | None  # the batch Spark replays
    pending: list[Journalled]  # batches Spark never logged: the next ones, in order


class JournalledBatches:
    def __init__(self, options: JournalOptions, queues: tuple[str, ...], redelivery: RedeliveryFilter) -> None:
        self.journal = BatchJournal(options.location, options.display_location)
        self.queues = queues
        self.filter = redelivery
        self.entries: dict[int, JournalEntry] = {}  # batch number -> entry, until deleted
        self._retire_after = 0.0

    def recover(self, frontier: str, replay: str | None, next_seq: int) -> Recovered:
        """Match the journal to Spark's offsets: which batches are committed, replayed, or never logged.

        ``frontier`` is the start of the batch Spark asks for next (or replays);
        ``replay`` the end of a batch Spark replays. Must run before the first
        delivery is looked at, so that every redelivered copy meets the filter.
        """
        entries = self.journal.load()
        if not entries:
            return Recovered(next_seq, None, None, [])
        initial = AmqpSourceOffset.initial(self.queues).key
        plan = classify(entries, frontier, replay, initial, self.journal.display)
        for entry in plan.discard:
            self.journal.delete(entry)
        committed = None
        for entry in plan.committed:
            committed = next_seq
            self._adopt(next_seq, entry)
            next_seq += 1
        replayed = None
        if plan.replayed is not None:
            replayed = self._read_back(next_seq, plan.replayed)
            next_seq += 1
        pending = []
        key = plan.replayed.end if plan.replayed is not None else frontier
        for entry in plan.pending:
            if plan.stale and entry.start != key:  # offsets of an earlier checkpoint: chained from this one's
                entry = self.journal.restart_from(entry, key)
            pending.append(self._read_back(next_seq, entry))
            key = entry.end
            next_seq += 1
        if plan.stale and pending:
            log.warning(
                "AMQP source: Spark starts this query from scratch, and journal %s holds %d batch(es) (%d rows) that no "
                "checkpoint is known to have committed (this query's first run died before Spark logged them, or an "
                "earlier checkpoint's query stopped before it knew): their messages are no longer in RabbitMQ, so they "
                "are this query's first batches. If an earlier query did commit them into the same sink, they are there twice.",
                self.journal.display,
                len(pending),
                sum(p.rows for p in pending),
            )
        log.info(
            "AMQP source: journal %s: %d committed batch(es) whose copies may come back, %s, %d batch(es) Spark never logged read again",
            self.journal.display,
            len(plan.committed),
            f"replaying {replayed.rows} row(s)" if replayed else "nothing to replay",
            len(pending),
        )
        return Recovered(next_seq, committed, replayed, pending)

    def _read_back(self, seq: int, entry: JournalEntry) -> Journalled:
        self._adopt(seq, entry)
        return Journalled(seq, entry.start, entry.end, self.journal.parts(entry), entry.rows)

    def _adopt(self, seq: int, entry: JournalEntry) -> None:
        self.entries[seq] = entry
        # If acks may have been sent, some copies will not come back. Message ids
        # still identify the ones that do; identical content does not, so those
        # are emitted again (a duplicate, never a loss).
        self.filter.expect(
            ((queue, fp), seq) for queue, prints in entry.fingerprints.items() for fp in prints if not (entry.acking and fp[0] == "fp")
        )

    def record(self, seq: int, start: str, end: str, parts: list[bytes], taken: list[Entry], by: str) -> None:
        """Write a planned batch: from then on the journal holds its messages, and they may be acknowledged."""
        prints: dict[str, list[Fingerprint]] = {}
        for entry in taken:
            prints.setdefault(entry.delivery.queue, []).append(fingerprint(entry.delivery, by))
        self.entries[seq] = self.journal.write(start, end, parts, prints)

    def ack_proven(self) -> None:
        self._retire_after = 0.0  # a proven ack may free entries at once

    def retire(self, committed: int, ledgers: Iterable[SessionLedger], force: bool = False) -> None:
        """Delete entries of committed batches the broker can no longer send copies of; mark the others committed."""
        if not self.entries:
            return
        now = time.monotonic()
        if not force and now < self._retire_after:
            return
        self._retire_after = now + RETIRE_INTERVAL
        done = [s for s in self.entries if s <= committed]
        if not done:
            return
        unproven: set[int] = set()
        for ledger in ledgers:
            unproven.update(ledger.unproven(committed))
        for seq in done:
            entry = self.entries[seq]
            if seq not in unproven and not self.filter.holds(seq):
                self.journal.delete(self.entries.pop(seq))
            elif not entry.committed:
                # Kept for its copies: a query on a new checkpoint must not read it again.
                self.entries[seq] = self.journal.mark_committed(entry)
