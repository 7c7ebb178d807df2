"""``SourceRuntime``: the source's state in Spark's source-runner process.

It turns what the consumer session delivered into micro-batches, serves each
batch's rows to ``partitions`` from memory, and acknowledges a batch only once
Spark has committed it: in ``commit(end)``, and in the next ``latestOffset``
(Spark calls it only after the previous batch reached the commit log, and it
never calls ``commit`` while idle or for the last batch of an AvailableNow run).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..client import AmqpClient, queue_depths
from ..errors import AmqpSourceError, explain, is_transient
from ..offsets import AmqpSourceOffset, QueuePosition
from ..options import DEFAULT_JOURNAL_RETENTION, SourceOptions
from . import arrow
from .admission import Admission
from .journalled import JournalledBatches
from .ledger import Entry, RedeliveryFilter, SessionLedger
from .session import AckConfirmed, ConsumerSession, Delivery, SessionClosed

log = logging.getLogger("spark_amqp.source")

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
AUTO_PARTITION_ROWS = 25_000
IDLE_RECHECK_SECONDS = 0.5
BACKLOG_INTERVAL = 1.0  # at most one round of passive declares a second for the progress report


@dataclass
class PlannedBatch:
    seq: int
    partitions: list[bytes]
    rows: int


@dataclass
class SourceMetrics:
    emitted: int = 0
    batches: int = 0
    redeliveries_dropped: int = 0
    sessions_lost: int = 0
    acks_sent: int = 0


class SourceRuntime:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.run_id = uuid.uuid4().hex[:12]
        self.session: ConsumerSession | None = None
        self.buffer: deque[Entry] = deque()
        self.ledgers: dict[str, SessionLedger] = {}
        self.dead_sessions: set[str] = set()
        journal = options.journal
        self.filter = RedeliveryFilter(journal.retention if journal else DEFAULT_JOURNAL_RETENTION, options.dedupe_by)
        self.journalled = JournalledBatches(journal, options.queues, self.filter) if journal else None
        self.recovered = journal is None  # journal read back and matched to Spark's offsets
        self.planned: dict[str, PlannedBatch] = {}
        self.next_seq = 1
        self.committed_seq = 0
        self.last_end = AmqpSourceOffset.initial(options.queues)
        self.metrics = SourceMetrics()
        self.admission = Admission(options.trigger)
        self.available_now: dict[str, int] | None = None
        self._idle_since: float | None = None
        self._backlog: dict[str, Any] | None = None
        self._backlog_at = -BACKLOG_INTERVAL
        self._terminating = False

    # -- lifecycle --------------------------------------------------------------

    def ensure_started(self) -> ConsumerSession:
        if self.session is None:
            self.session = ConsumerSession(self.options, self.run_id)
            if _in_source_runner():
                self._install_sigterm_handler()
            self.session.start()
        self.session.check()
        return self.session

    def shutdown(self) -> None:
        if self.session is not None:
            self.session.stop()

    def _install_sigterm_handler(self) -> None:
        # Spark stops a query by sending the runner SIGTERM; close the channels
        # cleanly first so unacked deliveries return to their queues at once.
        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            if self._terminating:
                return
            self._terminating = True
            try:
                self.shutdown()
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)

    # -- Spark's calls ------------------------------------------------------------

    def latest_offset(self, start: dict[str, Any] | None, max_rows: int | None = None, use_minimum: bool = True) -> dict[str, Any]:
        origin = AmqpSourceOffset.from_json(start) if start else self.last_end
        if not self.recovered:
            self._recover(origin.key, None)
        session = self.ensure_started()
        if self.planned:  # every batch planned before this call is in the commit log
            self._committed(max(b.seq for b in self.planned.values()))
        self._pump()
        self._acknowledge()
        limit = self.options.max_messages_per_trigger if max_rows is None else max_rows
        now = time.monotonic()
        if self.available_now is None and use_minimum and not self.admission.admit(len(self.buffer), now, limit, True):
            taken = []  # fewer than minMessagesPerTrigger, and maxTriggerDelay has not passed
        else:
            taken = self._take(limit)
        if self.available_now is not None:
            # Trigger.AvailableNow ends the run at the first latestOffset that
            # returns its start, so wait for data until the target is reached.
            while not taken and any(self.available_now.values()):
                session.check()
                time.sleep(0.01)
                self._pump()
                self._acknowledge()
                taken = self._take(limit)
            if not taken:
                self._await_acks(session)
        if not taken:
            self._retire()
            return origin.to_json()
        end = self._plan(origin, taken)
        self.admission.fired(now)
        self.last_end = end
        return end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[bytes]:
        end_offset = AmqpSourceOffset.from_json(end)
        if AmqpSourceOffset.from_json(start) == end_offset:
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
            self.last_end = end_offset
            return []
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
        if self.session is None:
            depths = self._queue_depths(self.options.queues)
            self.ensure_started()
            self.available_now = dict(depths)
        else:
            # Consuming already: stop deliveries so that queue depth plus what is
            # here is an exact snapshot, then carry on.
            session = self.ensure_started()
            session.pause()
            self._pump()
            depths = self._queue_depths(self.options.queues)
            buffered = Counter(e.delivery.queue for e in self.buffer)
            self.available_now = {q: depths[q] + buffered[q] for q in self.options.queues}
            session.resume()
        log.info("AMQP source: AvailableNow run will read %s", self.available_now)

    def backlog(self) -> dict[str, Any] | None:
        """Per queue, messages ready on the broker and delivered here but not yet in a batch.

        What Spark 4.2+ shows as the source's ``latestOffset`` in the query's
        progress. Cached for ``BACKLOG_INTERVAL``; a failed measurement keeps
        the last value rather than failing the query (the consumer reports
        real failures).
        """
        session = self.session
        now = time.monotonic()
        if session is None or now - self._backlog_at < BACKLOG_INTERVAL:
            return self._backlog
        self._backlog_at = now
        try:
            ready = session.ready_counts(timeout=min(2.0, self.options.connection.connection_timeout))
        except AmqpSourceError as err:
            log.debug("AMQP source: backlog not measured: %s", err)
            return self._backlog
        prefetched = Counter(e.delivery.queue for e in self.buffer)
        self._backlog = {q: {"ready": ready[q], "prefetched": prefetched[q]} for q in self.options.queues}
        return self._backlog

    # -- internals -------------------------------------------------------------------

    def _pump(self) -> None:
        assert self.session is not None
        if not self.recovered:  # deliveries wait until the journal's redelivered copies are known
            return
        inbox = self.session.inbox
        buffer = self.buffer
        ledgers = self.ledgers
        filt = self.filter
        while inbox:
            item = inbox.popleft()
            if type(item) is Delivery:
                sid = item.session
                ledger = ledgers.get(sid)
                if ledger is None:
                    if sid in self.dead_sessions:
                        continue
                    ledger = ledgers[sid] = SessionLedger()
                entry = Entry(item.tag, item)
                ledger.add(entry)
                if item.redelivered:
                    owner = filt.match(item)
                    if owner is not None:
                        entry.owner = owner
                        self.metrics.redeliveries_dropped += 1
                        continue
                buffer.append(entry)
            elif isinstance(item, SessionClosed):
                self._session_closed(item)
            elif isinstance(item, AckConfirmed):
                ledger = ledgers.get(item.session)
                if ledger is not None:
                    ledger.confirmed(item.tag)
                    if self.journalled is not None:
                        self.journalled.ack_proven()
        filt.expire()

    def _session_closed(self, event: SessionClosed) -> None:
        self.metrics.sessions_lost += 1
        self.dead_sessions.add(event.session)
        ledger = self.ledgers.pop(event.session, None)
        # Unplanned deliveries of the dead channel come back as redeliveries.
        unplanned = [e for e in self.buffer if e.delivery.session == event.session]
        if unplanned:
            # In place: _pump holds a reference to this deque.
            kept = [e for e in self.buffer if e.delivery.session != event.session]
            self.buffer.clear()
            self.buffer.extend(kept)
        if ledger is not None:
            self.filter.session_lost(list(ledger.owned()), unplanned)
        log.info("AMQP source: session %s (queue '%s') ended: %s", event.session, event.queue, event.reason)

    def _committed(self, seq: int) -> None:
        self.committed_seq = max(self.committed_seq, seq)
        for key in [k for k, b in self.planned.items() if b.seq <= self.committed_seq]:
            del self.planned[key]

    def _acknowledge(self) -> None:
        assert self.session is not None
        if self.journalled is not None:
            self.journalled.before_acks(self.committed_seq)
        for sid, ledger in self.ledgers.items():
            tag = ledger.advance(self.committed_seq)
            if tag is not None:
                self.session.ack(sid, tag)
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
            queue = entry.delivery.queue
            if quota.get(queue, 0) > 0:
                quota[queue] -= 1
                taken.append(entry)
            else:
                kept.append(entry)  # beyond this run's target: stays unacked, returns to the queue
        # Skipped entries go back in front, in place (_pump holds this deque).
        kept.extend(buffer)
        buffer.clear()
        buffer.extend(kept)
        if not taken:
            self._check_drained()
        return taken

    def _check_drained(self) -> None:
        """AvailableNow: a queue that is empty on the broker and here has nothing more to give."""
        assert self.available_now is not None
        waiting = [q for q, n in self.available_now.items() if n > 0]
        if not waiting:
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
            return
        if now - self._idle_since < IDLE_RECHECK_SECONDS:
            return
        self._idle_since = now
        for queue, depth in self._queue_depths(waiting).items():
            if depth == 0 and not any(e.delivery.queue == queue for e in self.buffer):
                log.info("AMQP source: queue '%s' drained before its AvailableNow target; finishing it", queue)
                self.available_now[queue] = 0

    def _plan(self, origin: AmqpSourceOffset, taken: list[Entry]) -> AmqpSourceOffset:
        seq = self.next_seq
        self.next_seq += 1
        positions: dict[str, QueuePosition] = {}
        for entry in taken:
            entry.owner = seq
            delivery = entry.delivery
            positions[delivery.queue] = QueuePosition(delivery.session, delivery.tag)
        rows = [e.delivery for e in taken]
        batch = arrow.to_record_batch(rows)
        count = self.options.num_partitions or math.ceil(len(rows) / AUTO_PARTITION_ROWS)
        count = max(1, min(count, len(rows)))
        step = math.ceil(len(rows) / count)
        parts = [arrow.to_ipc(batch.slice(i, step)) for i in range(0, len(rows), step)]
        end = origin.advanced(positions)
        if self.journalled is not None:  # durable before Spark logs the offset: a replay reads it back
            self.journalled.record(seq, origin.key, end.key, parts, taken, self.options.dedupe_by)
        self.planned[end.key] = PlannedBatch(seq, parts, len(rows))
        self.metrics.emitted += len(rows)
        self.metrics.batches += 1
        return end

    def _await_acks(self, session: ConsumerSession, timeout: float = 5.0) -> None:
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
        if found.replay is not None and replay is not None:
            seq, parts, rows = found.replay
            self.planned[replay] = PlannedBatch(seq, parts, rows)

    def _retire(self, force: bool = False) -> None:
        if self.journalled is not None:
            self.journalled.retire(self.committed_seq, self.ledgers.values(), force)

    def _queue_depths(self, queues: list[str] | tuple[str, ...]) -> dict[str, int]:
        """Ready messages per queue; transient failures are retried for up to connectionTimeout."""
        connection = self.options.connection

        async def measure() -> dict[str, int]:
            client = await AmqpClient.connect(connection, f"spark-amqp source {self.run_id} depth")
            try:
                return await queue_depths(client, queues)
            finally:
                await client.close()

        deadline = time.monotonic() + connection.connection_timeout
        backoff = 0.2
        while True:
            try:
                return asyncio.run(measure())
            except Exception as err:
                if is_transient(err) and time.monotonic() + backoff < deadline:
                    log.warning("AMQP source: cannot measure queue depths (%s); retrying", err)
                    time.sleep(backoff)
                    backoff = min(2 * backoff, 5.0)
                    continue
                subject = f"queue '{queues[0]}'" if len(queues) == 1 else f"queues {', '.join(queues)}"
                raise AmqpSourceError(explain(err, connection.display_uri, connection.username, connection.vhost, subject)) from err


def _in_source_runner() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == RUNNER_MODULE
