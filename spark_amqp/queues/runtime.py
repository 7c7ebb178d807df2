"""``SourceRuntime``: the source's state in Spark's source-runner process.

It turns what the consumer session delivered into micro-batches and serves
each batch's rows to ``partitions`` from memory. Without a journal a batch is
acknowledged only once Spark has committed it: in ``commit(end)``, and in the
next ``latestOffset`` (Spark calls it only after the previous batch reached the
commit log, and it never calls ``commit`` while idle or for the last batch of an
AvailableNow run). With a journal a batch is acknowledged as soon as its entry
is written, and a redelivery a quorum queue counts towards its delivery-limit is
journalled at once as a batch of its own, to be given to Spark next.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from ..errors import AmqpSourceError
from ..reading import arrow
from ..reading.admission import Admission
from ..reading.core_properties import queue_rows_path
from .amqp10_session import Amqp10Session
from .available_now import AvailableNow, measure_depths
from .delivery_limit import DeliveryLimitGuard, max_returns, over_limit, reason
from .intake import Intake, returns
from .journalled import Journalled, JournalledBatches
from .ledger import Entry, RedeliveryFilter, SessionLedger
from .offset import AmqpSourceOffset, QueuePosition
from .options import DEFAULT_JOURNAL_RETENTION, SourceOptions
from .session import ConsumerSession
from .sigterm import in_source_runner, shut_down_first

log = logging.getLogger("spark_amqp.queues")

AUTO_PARTITION_ROWS = 25_000
BACKLOG_INTERVAL = 1.0  # at most one round of passive declares a second for the progress report
FILL_QUIET = 0.1  # seconds without a delivery that end an AvailableNow batch's wait for more (see _take_available_now)
HELD = sys.maxsize  # with a journal, every batch's messages are in it: all of them may be acknowledged


@dataclass
class PlannedBatch:
    seq: int
    start: str  # AmqpSourceOffset.key
    end: AmqpSourceOffset
    partitions: list[bytes]
    rows: int


@dataclass
class SourceMetrics:
    emitted: int = 0
    batches: int = 0
    acks_sent: int = 0
    rescued: int = 0  # redeliveries journalled at once (with a journal)
    dead_lettered: int = 0  # messages at maxDeliveryCount dead-lettered (onDeliveryLimit=deadLetter)


class SourceRuntime:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.run_id = uuid.uuid4().hex[:12]
        self.session: ConsumerSession | Amqp10Session | None = None
        journal = options.journal
        self.filter = RedeliveryFilter(journal.retention if journal else DEFAULT_JOURNAL_RETENTION, options.dedupe_by)
        self.intake = Intake(self.filter, options.prefetch if journal else 0)
        self.journalled = JournalledBatches(journal, options.queues, self.filter) if journal else None
        self.recovered = journal is None  # journal read back and matched to Spark's offsets
        self.planned: dict[str, PlannedBatch] = {}  # by end key, until committed
        self.pending: deque[PlannedBatch] = deque()  # planned and journalled, not yet given to Spark
        self.next_seq = 1
        self.given_seq = 0  # the last batch latestOffset returned (or Spark replayed)
        self.committed_seq = 0
        self.last_end = AmqpSourceOffset.initial(options.queues)  # the end of the newest batch planned
        self.metrics = SourceMetrics()
        log.info("AMQP source: %s", queue_rows_path())
        self.admission = Admission(options.trigger)
        self.available_now: AvailableNow | None = None
        self.returns_guard = DeliveryLimitGuard()
        self._backlog: dict[str, Any] | None = None
        self._backlog_at = -BACKLOG_INTERVAL

    @property
    def buffer(self) -> deque[Entry]:
        return self.intake.buffer

    @property
    def ledgers(self) -> dict[str, SessionLedger]:
        return self.intake.ledgers

    # -- lifecycle --------------------------------------------------------------

    def ensure_started(self) -> ConsumerSession | Amqp10Session:
        if self.session is None:
            kind = Amqp10Session if self.options.connection.amqp10 else ConsumerSession
            self.session = kind(self.options, self.run_id)
            if in_source_runner():
                shut_down_first(self.shutdown)
            self.session.start()
        self.session.check()
        return self.session

    def shutdown(self) -> None:
        if self.session is not None:
            self.session.stop()

    # -- Spark's calls ------------------------------------------------------------

    def latest_offset(self, start: dict[str, Any] | None, max_rows: int | None = None, use_minimum: bool = True) -> dict[str, Any]:
        origin = AmqpSourceOffset.from_json(start) if start else self.last_end
        if not self.recovered:
            self._recover(origin.key, None)
        if not self.pending:
            # Spark has every batch planned so far: what is journalled next (a rescue) follows its start.
            self.last_end = origin
        session = self.ensure_started()
        if self.given_seq > self.committed_seq:  # every batch given before this call is in the commit log
            self._committed(self.given_seq)
        self._pump()
        if self.pending:
            self._acknowledge()
            return self._give(origin, self.pending.popleft())
        limit = self.options.max_messages_per_trigger if max_rows is None else max_rows
        now = time.monotonic()
        if self.available_now is not None:
            taken = self._take_available_now(session, limit)
            if self.pending:  # redeliveries journalled while waiting go first
                self._unplan(taken)
                self._acknowledge()
                return self._give(origin, self.pending.popleft())
        elif use_minimum and not self.admission.admit(len(self.buffer), now, limit, True):
            taken = []  # fewer than minMessagesPerTrigger, and maxTriggerDelay has not passed
        else:
            taken = self._take(limit)
        if not taken:
            self._acknowledge()
            if self.available_now is not None:
                self._await_acks(session)  # the run ends here: its last acks must reach the broker
            self._retire()
            return origin.to_json()
        batch = self._plan(origin, taken)
        self.admission.fired(now)
        # The committed batches' acks go after the batch is built: the deliveries they let in
        # are read by the I/O thread, which would otherwise compete with it for the GIL.
        self._acknowledge()
        return self._give(origin, batch)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[bytes]:
        end_offset = AmqpSourceOffset.from_json(end)
        if AmqpSourceOffset.from_json(start) == end_offset:
            if not self.pending:
                self.last_end = end_offset
            return []
        batch = self.planned.get(end_offset.key)
        if batch is None and not self.recovered:
            self._recover(AmqpSourceOffset.from_json(start).key, end_offset.key)
            batch = self.planned.get(end_offset.key)
        if batch is None:
            log.warning(
                "AMQP source: batch ending at %s was planned by an earlier run of this query and its messages are no longer "
                "in memory. They were never acknowledged, so the broker redelivers them (flagged redelivered) and they are "
                "read again in later batches; this replay returns no rows.",
                end_offset.key,
            )
            if not self.pending:
                self.last_end = end_offset
            return []
        self.given_seq = max(self.given_seq, batch.seq)
        return batch.partitions

    def commit(self, end: dict[str, Any]) -> None:
        batch = self.planned.get(AmqpSourceOffset.from_json(end).key)
        if batch is not None:
            self._committed(batch.seq)
        if self.session is not None:
            self._pump()
            self._acknowledge()
            self._retire()

    def prepare_available_now(self) -> None:
        """Fix the target: what each queue holds now (passive declare) plus what is buffered here."""
        name = f"spark-amqp source {self.run_id} depth"
        if self.session is None:
            depths = measure_depths(self.options.connection, name, self.options.queues)
            self.ensure_started()
            targets = dict(depths)
        else:
            # Consuming already: stop deliveries so that queue depth plus what is
            # here is an exact snapshot, then carry on.
            session = self.ensure_started()
            session.pause()
            self._pump()
            depths = measure_depths(self.options.connection, name, self.options.queues)
            buffered = Counter(e.delivery.queue for e in self.buffer)
            targets = {q: depths[q] + buffered[q] for q in self.options.queues}
            session.resume()
        self.available_now = AvailableNow(targets, self.options.connection, name)
        log.info("AMQP source: AvailableNow run will read %s", targets)

    def backlog(self) -> dict[str, Any] | None:
        """Per queue, messages ready on the broker and delivered here but not yet in a batch.

        What Spark 4.2+ shows as the source's ``latestOffset`` in the query's
        progress, with the highest ``x-delivery-count`` this run has seen where a
        quorum queue stamped one. Cached for ``BACKLOG_INTERVAL``; a failed
        measurement keeps the last value rather than failing the query (the
        consumer reports real failures).
        """
        session = self.session
        now = time.monotonic()
        if session is not None and session.outage.down:
            # Nothing can be measured: say so, beside the last figures, rather than show an idle queue.
            return {**(self._backlog or {}), "outage": session.outage.report()}
        if session is None or now - self._backlog_at < BACKLOG_INTERVAL:
            return self._backlog
        self._backlog_at = now
        try:
            ready = session.ready_counts(timeout=min(2.0, self.options.connection.connection_timeout))
        except AmqpSourceError as err:
            log.debug("AMQP source: backlog not measured: %s", err)
            return self._backlog
        prefetched = Counter(e.delivery.queue for e in self.buffer)
        most = self.intake.most_returns
        self._backlog = {
            q: {"ready": ready[q], "prefetched": prefetched[q], **({"deliveryCount": most[q]} if q in most else {})}
            for q in self.options.queues
        }
        return self._backlog

    # -- internals -------------------------------------------------------------------

    def _give(self, origin: AmqpSourceOffset, batch: PlannedBatch) -> dict[str, Any]:
        if batch.start != origin.key:
            raise AmqpSourceError(
                f"internal error: the next journalled batch starts at {batch.start}, but Spark asks from {origin.key}; "
                "the query can be restarted safely (the journal still holds the batch)"
            )
        self.given_seq = batch.seq
        return batch.end.to_json()

    def _pump(self) -> None:
        assert self.session is not None
        if not self.recovered:  # deliveries wait until the journal's redelivered copies are known
            return
        returned, proven = self.intake.take(self.session.inbox, not self.session.marks_redeliveries)
        if proven and self.journalled is not None:
            self.journalled.ack_proven()
        if returned:
            if self.journalled is not None:
                self._rescue(returned)
            else:
                limit = max_returns(self.options.max_delivery_count, self.session.server_version)
                failure = self.returns_guard.check(returned, limit)
                if failure is not None and isinstance(self.session, Amqp10Session) and self.options.dead_letter_at_limit:
                    self._dead_letter(self.session, over_limit(returned, limit), limit)
                elif failure is not None:
                    self.shutdown()  # gives the deliveries back with nacks, which RabbitMQ 4.3 does not count
                    raise failure

    def _dead_letter(self, session: Amqp10Session, entries: list[Entry], limit: int) -> None:
        self.intake.set_apart(entries)
        if self.available_now is not None:
            for entry in entries:
                self.available_now.take(entry.delivery.queue)
        session.dead_letter([(e.delivery.session, e.tag, reason(e, limit)) for e in entries])
        self.metrics.dead_lettered += len(entries)
        log.warning("AMQP source: %d message(s) at maxDeliveryCount dead-lettered: %s", len(entries), reason(entries[0], limit))

    def _rescue(self, entries: list[Entry]) -> None:
        """Redeliveries a quorum queue counts towards its delivery-limit: journalled now, acknowledged, and given
        to Spark as the next batches, so that whatever happens to this query next, the broker never returns them again."""
        rescued = set(entries)
        self.intake.keep_only(lambda e: e not in rescued)
        if self.available_now is not None:
            for entry in entries:
                self.available_now.take(entry.delivery.queue)
        step = self.options.max_messages_per_trigger
        for i in range(0, len(entries), step):
            self.pending.append(self._plan(self.last_end, entries[i : i + step]))
        self.metrics.rescued += len(entries)
        log.info(
            "AMQP source: %d redelivered message(s) a quorum queue counts towards its delivery-limit (x-delivery-count up to "
            "%d) are journalled and acknowledged at once, and make the next batch(es)",
            len(entries),
            max(returns(e.delivery) for e in entries),
        )

    def _committed(self, seq: int) -> None:
        self.committed_seq = max(self.committed_seq, seq)
        for key in [k for k, b in self.planned.items() if b.seq <= self.committed_seq]:
            del self.planned[key]

    def _acknowledge(self) -> None:
        assert self.session is not None
        custody = self.journalled is not None
        ackable = HELD if custody else self.committed_seq
        for sid, ledger in self.intake.ledgers.items():
            acks = ledger.next_acks(ackable, singles=custody)
            if acks is not None:
                self.session.ack(sid, acks.multiple, acks.singles, acks.round)
                self.metrics.acks_sent += 1

    def _take(self, limit: int) -> list[Entry]:
        buffer = self.buffer
        quota = self.available_now
        if quota is None:
            n = min(limit, len(buffer))
            return [buffer.popleft() for _ in range(n)]
        taken: list[Entry] = []
        kept: deque[Entry] = deque()
        while buffer and len(taken) < limit:
            entry = buffer.popleft()
            if quota.take(entry.delivery.queue):
                taken.append(entry)
            else:
                kept.append(entry)  # beyond this run's target: stays unacked, returns to the queue
        # Skipped entries go back in front, in place (the intake holds this deque).
        kept.extend(buffer)
        buffer.clear()
        buffer.extend(kept)
        if not taken:
            quota.check_drained(self._settle)
        return taken

    def _settle(self, queues: list[str]) -> set[str] | None:
        """The queues of which something is buffered once every delivery the broker sent them so far is here."""
        assert self.session is not None
        try:
            if not self.session.settle(queues, timeout=min(2.0, self.options.connection.connection_timeout)):
                return None
        except AmqpSourceError as err:  # no answer in time: the consumer's own checks report a lasting outage
            log.debug("AMQP source: deliveries not settled: %s", err)
            return None
        self._pump()
        return {e.delivery.queue for e in self.buffer}

    def _take_available_now(self, session: ConsumerSession | Amqp10Session, limit: int) -> list[Entry]:
        """The next batch of an AvailableNow run, which Spark ends at the first latestOffset that returns its start:
        so wait for data until the run's target is reached.

        And wait for a full batch (``limit``, or what is left of the target) while the broker is still delivering:
        each batch costs Spark a fixed 0.3-0.5 s of CPU and wall time (offset and commit logs, a job), which the
        broker's deliveries compete with on a small machine. Taking what had arrived the moment Spark asked made
        batches of a few dozen messages whenever the broker lagged behind Spark. A buffer that stops growing
        for ``FILL_QUIET`` seconds (a queue that ran dry, a full prefetch window) is taken as it is."""
        quota = self.available_now
        assert quota is not None
        seen, quiet_since = len(self.buffer), time.monotonic()
        while not self.pending:
            held, now = len(self.buffer), time.monotonic()
            if held != seen:
                seen, quiet_since = held, now
            if held >= min(limit, quota.outstanding) or (held and now - quiet_since >= FILL_QUIET):
                taken = self._take(limit)
                if taken or quota.reached:
                    return taken
            elif quota.reached:
                return []
            elif not held:
                self._take(limit)  # finishes queues the broker reports empty before their target
            session.check()
            time.sleep(0.005)
            self._pump()
            self._acknowledge()
        return []

    def _unplan(self, taken: list[Entry]) -> None:
        """Put taken entries back in front of the buffer (a journalled batch goes first)."""
        if self.available_now is not None:
            for entry in taken:
                self.available_now.give_back(entry.delivery.queue)
        self.buffer.extendleft(reversed(taken))

    def _plan(self, origin: AmqpSourceOffset, taken: list[Entry]) -> PlannedBatch:
        seq = self.next_seq
        self.next_seq += 1
        positions: dict[str, QueuePosition] = {}
        for entry in taken:
            delivery = entry.delivery
            positions[delivery.queue] = QueuePosition(delivery.session, delivery.tag)
        rows = [e.delivery for e in taken]
        # A journal keeps whole rows (a replay is the same whatever a restarted query's schema): QueueReader.read picks.
        batch = arrow.to_record_batch(rows, None if self.journalled is not None else self.options.columns)
        count = self.options.num_partitions or math.ceil(len(rows) / AUTO_PARTITION_ROWS)
        count = max(1, min(count, len(rows)))
        step = math.ceil(len(rows) / count)
        parts = [arrow.to_ipc(batch.slice(i, step)) for i in range(0, len(rows), step)]
        end = origin.advanced(positions)
        if self.journalled is not None:  # durable before Spark logs the offset and before any ack
            self.journalled.record(seq, origin.key, end.key, parts, taken, self.options.dedupe_by)
        self.intake.claim(taken, seq)
        planned = PlannedBatch(seq, origin.key, end, parts, len(rows))
        self.planned[end.key] = planned
        self.last_end = end
        self.metrics.emitted += len(rows)
        self.metrics.batches += 1
        if self.journalled is not None:
            self._acknowledge()  # the journal holds them now
        return planned

    def _await_acks(self, session: ConsumerSession | Amqp10Session, timeout: float = 5.0) -> None:
        """Before an AvailableNow run ends, make sure its last batch's acks reached the broker."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pump()
            if all(ledger.settled(self.committed_seq) for ledger in self.ledgers.values()):
                self._retire(force=True)
                return
            time.sleep(0.01)

    def _recover(self, frontier: str, replay: str | None) -> None:
        assert self.journalled is not None
        self.recovered = True
        found = self.journalled.recover(frontier, replay, self.next_seq)
        self.next_seq = found.next_seq
        if found.committed_seq is not None:
            self.committed_seq = found.committed_seq
        if found.replay is not None:
            self._serve(found.replay)
        for journalled in found.pending:
            self.pending.append(self._serve(journalled))

    def _serve(self, journalled: Journalled) -> PlannedBatch:
        batch = PlannedBatch(
            journalled.seq, journalled.start, AmqpSourceOffset.from_json(journalled.end), journalled.parts, journalled.rows
        )
        self.planned[journalled.end] = batch
        self.last_end = batch.end
        return batch

    def _retire(self, force: bool = False) -> None:
        if self.journalled is not None:
            self.journalled.retire(self.committed_seq, self.ledgers.values(), force)
