"""``StreamPlanner``: stream mode's state in Spark's source-runner process, on the driver.

It asks the broker where each stream ends (``probe``), decides how far each
micro-batch reads (``Admission``, ``ranges``) and splits the batch into offset
ranges that executors read themselves. It holds no message data and sends no
acks: a stream keeps its messages, so a batch is defined by its offsets alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..client.blocking import BlockingClient
from ..errors import AmqpOptionError, AmqpSourceError, BrokerUnreachable
from ..reading.admission import Admission
from ..transport.backoff import Backoff
from ..transport.outage import Outage
from . import expression_filters
from .access import access_for
from .held import log_rows_path
from .identity import Identities
from .offset import UNSET, StreamOffset
from .options import At, StreamSourceOptions
from .ranges import StreamRange, limit_ends, split
from .shortfall import Shortfall

log = logging.getLogger("spark_amqp.streams")

BACKLOG_INTERVAL = 1.0  # at most one round of probes a second for the progress report


class StreamPlanner:
    def __init__(self, options: StreamSourceOptions) -> None:
        if options.bounded:
            # Refused here, not in streamReader(): PySpark 4.2 hides an error raised there behind UnboundLocalError.
            raise AmqpOptionError(
                "options 'endingOffsets', 'endingTimestamp' and 'endingOffsetsByTimestamp' bound a batch read "
                "(spark.read); a streaming query has no end: leave them out, or use trigger(availableNow=True) to "
                "stop where the streams end when the run starts"
            )
        self.options = options
        self.streams = options.streams  # with a super stream found by name: its partitions when last asked
        self.access = access_for(options.connection)
        self.client: BlockingClient[Any] = BlockingClient(options.connection, "spark-amqp stream planner", self.access.connect)
        self.admission = Admission(options.trigger)
        self.available_now: dict[str, int] | None = None
        self._backlog_ends: dict[str, int] | None = None
        self._backlog_at = -BACKLOG_INTERVAL
        self.tails = self.access.tail_watch()
        self.identities = Identities(self.client, self.access, self.tails, options.fail_on_data_loss)
        self.shortfall = Shortfall(options.connection.outage_timeout)
        self._dropped: set[str] = set()  # streams of the checkpoint no longer read, already reported
        self._known: dict[str, int] | None = None  # the last ends measured
        self._expression_checked = False  # the broker took the filter expressions (checked once, by the first planning)
        self._backoff = Backoff()
        self._retry_at = 0.0
        self.outage = Outage(options.connection.outage_timeout, options.connection.display_uri)
        # PySpark 4.0/4.1 call latestOffset() without the batch's start: the last end this
        # process returned or was handed (a restart begins with partitions(x, x) of the newest
        # logged offset) stands in for it.
        self.last_end: StreamOffset | None = None
        log_rows_path(log, options.connection.stream_protocol, options.connection.amqp10)

    # -- Spark's calls ---------------------------------------------------------------

    def initial_offset(self) -> StreamOffset:
        """Where a new query starts. ``last`` and ``next`` move with the stream, so they stay ``UNSET``
        here and the first batch fixes them (see ``offset``); the other forms give the same answer
        again when a crash makes Spark ask a second time."""
        self._discover()
        ends = self.ends()  # fails fast on a missing stream, a queue that is not one, or a refused login
        positions = {}
        for stream in self.streams:
            positions[stream] = self._fixed_start(stream, ends[stream])
        return StreamOffset.of(positions)

    def latest_offset(self, start: dict[str, Any] | None, max_rows: int | None, use_minimum: bool) -> StreamOffset:
        origin = StreamOffset.from_json(start) if start else (self.last_end or self.initial_offset())
        end = self._latest(origin, max_rows, use_minimum)
        if self.available_now is not None:
            end = self._until_the_run_moves(origin, end, max_rows)
        self.last_end = end
        return end

    def _until_the_run_moves(self, origin: StreamOffset, end: StreamOffset, max_rows: int | None) -> StreamOffset:
        """Spark ends an AvailableNow run at the first latestOffset that returns its start. A stream still short of
        where it ended when the run started, whose member is behind or whose broker is away, would end it
        "successfully" with those offsets unread: so plan again here until a batch moves, or fail once nothing has
        for brokerOutageTimeout (an outage's own error comes first where the broker is away)."""
        assert self.available_now is not None
        targets = self.available_now
        timeout = self.options.connection.outage_timeout
        backoff = Backoff(cap=1.0)
        since = time.monotonic()
        while not any(end.get(s) != origin.get(s) for s in self.streams):
            short = {s: t for s, t in targets.items() if s in self.streams and origin.get(s) != UNSET and origin.get(s) < t}
            if not short:
                return end  # every stream reached its target: the run is done
            measured = self._known or {}
            said = "; ".join(
                f"stream '{s}' ends at offset {measured.get(s, 0)} on the node asked, before offset {t} where it ended "
                f"when this availableNow run started, and the query has read it up to {origin.get(s)}"
                for s, t in sorted(short.items())
            )
            waited = time.monotonic() - since
            if waited >= timeout:
                raise AmqpSourceError(
                    f"{said}; still after {waited:.0f}s (brokerOutageTimeout={timeout:g}s): the run fails rather than end "
                    "with those offsets unread. A member catching up (a replica added back, a restarted node) would have "
                    "caught up by now: the stream was deleted and declared again, or its member there is stuck. Run again "
                    "(it reads on from the checkpoint), or raise brokerOutageTimeout to wait longer"
                )
            if backoff.failures == 0:
                log.warning("AMQP source: %s; waiting up to brokerOutageTimeout=%gs for the rest", said, timeout)
            time.sleep(min(backoff.next(), max(0.0, since + timeout - time.monotonic())))
            end = self._latest(origin, max_rows, False)
        return end

    def _latest(self, origin: StreamOffset, max_rows: int | None, use_minimum: bool) -> StreamOffset:
        try:
            self._discover()
            self._check_dropped(origin)
            return self._plan(origin, max_rows, use_minimum)
        except BrokerUnreachable as err:
            if self._known is None:
                raise
            # Once started, an outage that keeps a question from being answered means no new batch yet,
            # until it has lasted brokerOutageTimeout.
            self.outage.failed(err, heard=self.client.heard, tried=self.client.tried)
            self.outage.check()
            log.warning("AMQP source: %s; no new batch until the broker answers", err)
            kept = {s: n for s, n in origin.positions if s in self.streams}
            return StreamOffset.of(kept, origin.marks_dict())

    def _plan(self, origin: StreamOffset, max_rows: int | None, use_minimum: bool) -> StreamOffset:
        unset = [s for s in self.streams if origin.get(s) == UNSET]
        if unset:
            # A batch of its own, with no rows: Spark logs it, so a replay starts where this run did.
            ends = self.ends()
            fixed = {s: self._moving_start(s, ends[s], added=bool(origin.positions) and s not in origin.as_dict()) for s in unset}
            log.info("AMQP source: streams start at %s", fixed)
            return StreamOffset.of({**origin.as_dict(), **fixed}, origin.marks_dict())
        starts = {s: origin.get(s) for s in self.streams}
        ends = self.ends()
        self.identities.check(origin, self.streams, None if self._known is None else 0.0)
        for stream in self.streams:
            if ends[stream] == 0:
                # Empty now: nothing to read. What is written next says whether retention emptied it
                # (offsets go on from here) or it was deleted and declared again (they start at 0).
                ends[stream] = starts[stream]
            said = f"stream '{stream}' ends at offset {ends[stream]} but this query has read it up to {starts[stream]}"
            if self.shortfall.short(stream, ends[stream], starts[stream], said):
                ends[stream] = starts[stream]  # nothing of it in this batch while it is short
        if self.available_now is not None:
            ends = {s: min(ends[s], max(starts[s], self.available_now.get(s, starts[s]))) for s in ends}
            use_minimum = False
        available = sum(ends[s] - starts[s] for s in ends)
        now = time.monotonic()
        take = self.admission.admit(available, now, max_rows, use_minimum)
        if take == 0:
            return StreamOffset.of(starts, origin.marks_dict())  # the origin, less any stream no longer read
        if take < available:
            ends = limit_ends(starts, ends, take)
        self.admission.fired(now)
        return StreamOffset.of(ends, self.identities.marks_for(ends, origin))

    def _check_dropped(self, origin: StreamOffset) -> None:
        """A stream the checkpoint reads but the options no longer name: its unread messages would never be
        read. Data loss, as Kafka treats a partition that is gone."""
        dropped = {s: n for s, n in origin.positions if s not in self.streams and n != UNSET and s not in self._dropped}
        if not dropped:
            return
        where = ", ".join(f"stream '{s}' (read up to offset {n})" for s, n in sorted(dropped.items()))
        why = (
            f"which super stream '{self.options.discover}' no longer has (its partitions are found by name, up to the first missing)"
            if self.options.discover
            else "which the options no longer name (a shorter 'stream' list, or a lower 'superStreamPartitions')"
        )
        message = f"this query's checkpoint reads {where}, {why}: what it holds after that offset would never be read"
        if self.options.fail_on_data_loss:
            raise AmqpSourceError(message + "; name it again, or set failOnDataLoss=false to stop reading it")
        log.warning("AMQP source: %s; no longer read (failOnDataLoss=false)", message)
        self._dropped.update(dropped)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamRange]:
        first, last = StreamOffset.from_json(start), StreamOffset.from_json(end)
        self.last_end = last
        if not self.streams:
            self._patiently(self._discover)  # a restart replays a batch before it asks for a new one
        for known in (last, first):  # after a restart: the batch Spark replays must read the same streams
            self._patiently(lambda: self.identities.check(known, self.streams))  # noqa: B023 (called at once)
        starts, ends = {}, {}
        for stream, stop in last.positions:
            begin = first.get(stream)
            if begin != UNSET and stop != UNSET:  # a batch that fixes where a stream starts reads nothing of it
                starts[stream], ends[stream] = begin, stop
        return split(starts, ends, self.options.num_partitions, self.options.min_partition_size)

    def _patiently(self, ask: Callable[[], None]) -> None:
        """Ask, waiting out an outage up to brokerOutageTimeout: a batch Spark has logged cannot be answered
        with "no batch yet", as latestOffset can (seen: a stream's only node drained under a query)."""
        backoff = Backoff()
        while True:
            answers = self.client.answers
            try:
                ask()
                if self.client.answers > answers:  # not an answer from what the planner knew: the outage goes on
                    self.outage.recovered()
                return
            except BrokerUnreachable as err:
                self.outage.failed(err, heard=self.client.heard, tried=self.client.tried)
                self.outage.check()
                delay = backoff.next()
                log.warning("AMQP source: %s; planning the batch again in %.1fs", err, delay)
                time.sleep(delay)

    def prepare_available_now(self) -> None:
        # Spark calls this before initialOffset and latestOffset: a super stream found by name has no
        # partitions yet, and a snapshot of no streams would make the run read nothing, successfully.
        self._discover()
        self.available_now = self.ends()
        log.info("AMQP source: AvailableNow run reads up to %s", self.available_now)

    def backlog(self) -> dict[str, Any] | None:
        """Per stream, where it ends now (the next offset to be written) and how many offsets lie between the
        end of the batch last planned and there (Kafka's offsetsBehindLatest): Spark 4.2+ shows it in the progress."""
        now = time.monotonic()
        if now - self._backlog_at >= BACKLOG_INTERVAL:
            self._backlog_at = now
            try:
                self._backlog_ends = dict(self.ends())
            except AmqpSourceError as err:
                log.debug("AMQP source: stream ends not measured: %s", err)
        outage = self.outage.report()
        if self._backlog_ends is None:
            return None if outage is None else {"outage": outage}
        planned = self.last_end
        report: dict[str, Any] = {}
        for stream, end in self._backlog_ends.items():
            read_to = UNSET if planned is None else planned.get(stream)
            report[stream] = {"end": end} if read_to == UNSET else {"end": end, "behind": max(0, end - read_to)}
        if outage is not None:
            report["outage"] = outage  # the ends above are the last measured
        return report

    def close(self) -> None:
        self.client.close()

    # -- the broker --------------------------------------------------------------------

    def ends(self) -> dict[str, int]:
        """Per stream, the offset after its last message (0 for an empty stream).

        The first answer must come within ``connectionTimeout``: a query that cannot reach the broker
        when it starts fails. After that an outage is waited out, however long: the last ends stand
        (no new batch) and the broker is asked again with backoff, with a warning each time."""
        streams = self.streams
        subject = f"stream '{streams[0]}'" if len(streams) == 1 else f"streams {', '.join(streams)}"
        # The last ends measured, if they cover every stream read now (a super stream can gain partitions).
        known = self._known if self._known is not None and set(streams) <= set(self._known) else None
        if known is not None and time.monotonic() < self._retry_at:
            self.outage.check()  # not only at the next attempt: that may come after the deadline
            return {s: known[s] for s in streams}
        try:
            # Once the broker was reached, one attempt per call: Spark's loop goes on while it is away.
            found = self.client.run(lambda c: self._ends_of(c, streams), subject, None if self._known is None else 0.0)
        except BrokerUnreachable as err:
            if known is None:
                raise
            self.outage.failed(err, heard=self.client.heard, tried=self.client.tried)
            self.outage.check()
            delay = min(self._backoff.next(), self.outage.left())
            self._retry_at = time.monotonic() + delay
            log.warning(
                "AMQP source: %s; no new batch until the broker answers (asking again in %.1fs, attempt %d)",
                err,
                delay,
                self._backoff.failures,
            )
            return {s: known[s] for s in streams}
        if self._backoff.failures:
            log.warning("AMQP source: the broker answers again after %d failed attempt(s)", self._backoff.failures)
        self._backoff.reset()
        self.outage.recovered()
        self._known = found
        return dict(found)

    async def _ends_of(self, client: Any, streams: tuple[str, ...]) -> dict[str, int]:
        await self.access.require(client, self.options)  # here, where the user sees it (see __init__)
        if not self._expression_checked and streams:
            await expression_filters.require(self.options.expression, self.options.connection, streams[0])
            self._expression_checked = True
        return await self.tails.ends_of(client, streams)

    def _fixed_start(self, stream: str, end: int, moving: bool = False) -> int:
        """Where a stream starts when that does not move with it; ``UNSET`` (the first batch fixes it) when it does.

        A timestamp with nothing at or after it means "from the end", which moves: like ``next``, the
        first batch fixes it, so that a replay of that batch after a crash starts at the same place."""
        start = self.options.start_of(stream)
        if isinstance(start, At):
            found = self.client.run(lambda c: self.access.offset_at(c, stream, start.epoch_ms), f"stream '{stream}'")
            if found is not None:
                return found
            return end if moving else UNSET
        if isinstance(start, int):
            if start > end:
                raise AmqpSourceError(
                    f"option 'startingOffsets' starts stream '{stream}' at offset {start}, past its end (the next offset "
                    f"it will write is {end}): give an offset up to {end}, or 'first', 'last' or 'next'"
                )
            return start
        if start == "first":
            return self._head(stream)
        return UNSET

    def _head(self, stream: str) -> int:
        found = self.client.run(lambda c: self.access.head(c, stream), f"stream '{stream}'")
        return 0 if found is None else found

    def _discover(self) -> None:
        name = self.options.discover
        if name is None:
            return
        # Only the first answer must come within connectionTimeout, as for ends().
        found = self.client.run(
            lambda c: self.access.partitions_of(c, name), f"super stream '{name}'", None if self._known is None else 0.0
        )
        if found != self.streams:
            log.info("AMQP source: super stream '%s' has %d partitions: %s", name, len(found), ", ".join(found))
            self.streams = found

    def _moving_start(self, stream: str, end: int, added: bool = False) -> int:
        """``added``: a partition a super stream gained after the query started, read from its first message."""
        start = "first" if added else self.options.start_of(stream)
        if start == "first":
            return self._head(stream)
        if start == "last":
            return max(0, end - 1)  # from the last message on
        if start == "next":
            return end
        return self._fixed_start(stream, end, moving=True)  # a timestamp with nothing after it yet, or a stream new to the query
