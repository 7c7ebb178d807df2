"""``JournalledBatches``: what the source runtime knows about its batch journal.

Which of this run's batch numbers have a journal entry, which of them may
already have had acks sent, and when an entry can go. Batches found in the
journal at start-up get batch numbers in this run too, so that redelivered
copies of their messages are acknowledged the same way as any other batch's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

from ..offsets import AmqpSourceOffset
from ..options import JournalOptions
from .journal import BatchJournal, JournalEntry, classify
from .ledger import Entry, Fingerprint, RedeliveryFilter, SessionLedger, fingerprint

log = logging.getLogger("spark_amqp.source")

RETIRE_INTERVAL = 0.2  # seconds between scans for deletable entries, unless an ack was just proven


class Recovered(NamedTuple):
    next_seq: int
    committed_seq: int | None  # the highest batch number given to an already committed batch
    replay: tuple[int, list[bytes], int] | None  # (batch number, partitions, rows) of the batch Spark replays


class JournalledBatches:
    def __init__(self, options: JournalOptions, queues: tuple[str, ...], redelivery: RedeliveryFilter) -> None:
        self.journal = BatchJournal(options.location, options.display_location)
        self.queues = queues
        self.filter = redelivery
        self.entries: dict[int, JournalEntry] = {}  # batch number -> entry, until deleted
        self._acking: set[int] = set()
        self._retire_after = 0.0

    def recover(self, frontier: str, replay: str | None, next_seq: int) -> Recovered:
        """Match the journal to Spark's offsets: which batches are committed, replayed, or never logged.

        ``frontier`` is the start of the batch Spark asks for next (or replays);
        ``replay`` the end of a batch Spark replays. Must run before the first
        delivery is looked at, so that every redelivered copy meets the filter.
        """
        entries = self.journal.load()
        if not entries:
            return Recovered(next_seq, None, None)
        initial = AmqpSourceOffset.initial(self.queues).key
        plan = classify(entries, frontier, replay, initial, self.journal.display)
        if plan.stale:
            log.warning("AMQP source: new checkpoint; discarding %d batch(es) of an earlier one from the journal", len(entries))
        for entry in plan.discard:
            self.journal.delete(entry)
        committed = None
        for entry in plan.committed:
            committed = next_seq
            self._adopt(next_seq, entry)
            next_seq += 1
        replayed = None
        if plan.replayed is not None:
            self._adopt(next_seq, plan.replayed)
            replayed = (next_seq, self.journal.parts(plan.replayed), plan.replayed.rows)
            next_seq += 1
        log.info(
            "AMQP source: journal %s: %d committed batch(es) whose copies may come back, %s, %d never-logged batch(es) dropped",
            self.journal.display,
            len(plan.committed),
            f"replaying {replayed[2]} row(s)" if replayed else "nothing to replay",
            len(plan.discard),
        )
        return Recovered(next_seq, committed, replayed)

    def _adopt(self, seq: int, entry: JournalEntry) -> None:
        self.entries[seq] = entry
        if entry.acking:
            self._acking.add(seq)
        # If acks may have been sent, some copies will not come back. Message ids
        # still identify the ones that do; identical content does not, so those
        # are emitted again (a duplicate, never a loss).
        self.filter.expect(
            ((queue, fp), seq) for queue, prints in entry.fingerprints.items() for fp in prints if not (entry.acking and fp[0] == "fp")
        )

    def record(self, seq: int, start: str, end: str, parts: list[bytes], taken: list[Entry], by: str) -> None:
        """Write a planned batch; Spark logs its end offset only after this returns."""
        prints: dict[str, list[Fingerprint]] = {}
        for entry in taken:
            prints.setdefault(entry.delivery.queue, []).append(fingerprint(entry.delivery, by))
        self.entries[seq] = self.journal.write(start, end, parts, prints)

    def before_acks(self, committed: int) -> None:
        """Mark committed batches as 'acks may be sent' before the first such ack leaves."""
        due = [s for s in self.entries if s <= committed and s not in self._acking]
        if due:
            self.journal.mark_acking(self.entries[s] for s in due)
            self._acking.update(due)

    def ack_proven(self) -> None:
        self._retire_after = 0.0  # a proven ack may free entries at once

    def retire(self, committed: int, ledgers: Iterable[SessionLedger], force: bool = False) -> None:
        """Delete entries of committed batches the broker can no longer send copies of."""
        if not self.entries:
            return
        now = time.monotonic()
        if not force and now < self._retire_after:
            return
        self._retire_after = now + RETIRE_INTERVAL
        done = [s for s in self.entries if s <= committed and not self.filter.holds(s)]
        if not done:
            return
        unproven: set[int] = set()
        for ledger in ledgers:
            unproven.update(ledger.unproven(committed))
        for seq in done:
            if seq not in unproven:
                self.journal.delete(self.entries.pop(seq))
                self._acking.discard(seq)
