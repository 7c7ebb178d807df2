"""``RangeReader``: reading one offset range of a stream, in an executor task, with a connection of its own.

What does not depend on the protocol lives here: the read loop, the checks on
jumps in the offsets (retention), a silent broker, filter widening, and resuming
after a lost connection. ``range_over_amqp`` and ``range_over_protocol``
subscribe and turn deliveries into rows. Both stop at the range's last offset and
drop whatever the broker sent beyond it, so a task never yields an offset
outside its range, and a replay yields the same rows. A lost connection resumes
after the last offset read, with backoff and without a deadline (the planner
reached the broker before the task was planned): a broker restart only delays
the task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pyarrow as pa

from ..errors import AmqpSourceError, ConnectionLost, InternalError, Unchecked, explain, is_transient
from ..stream_protocol import core
from ..stream_protocol.rows import Conversion
from ..transport.backoff import Backoff
from ..transport.outage import Outage
from . import filtering
from .access import access_for
from .held import HeldRows
from .options import StreamSourceOptions
from .ranges import StreamRange, judge_gap
from .shortfall import Shortfall

__all__ = ["FILTER_IDLE", "RangeReader", "Row"]

log = logging.getLogger("spark_amqp.streams")

Row = tuple[bytes, str, str, str, int, Any]
# A 541 at one offset this many times in a row is the message, not the broker.
REFUSALS_AT_ONE_OFFSET = 3
# With a filter, the broker skips the chunks that match nothing without a word, so a range whose last
# offsets match nothing would never see its end. After this long without a delivery, the filter takes in
# the value of the range's last message as well (see _widen_filter): a slow broker costs some chunks more.
FILTER_IDLE = 0.25


class RangeReader:
    """Subclasses open ``client`` (``_connect``), subscribe from ``next_offset`` (``_subscribe``, setting
    ``subscribed``), end the subscription (``_unsubscribe``), and hand what arrives to ``rows`` / ``gaps``
    through ``_offered``, setting ``arrived``; a failure they see goes to ``failure``."""

    def __init__(self, options: StreamSourceOptions, part: StreamRange) -> None:
        self.options = options
        self.part = part
        self.access = access_for(options.connection)
        self.next_offset = part.start  # the first offset not yet read
        self.done = part.size <= 0
        self.rows = HeldRows(options.columns)  # row tuples, and the compiled core's columns (range_over_protocol)
        self.client: Any = None
        self.subscribed = False
        self.failure: BaseException | None = None
        self.arrived = asyncio.Event()
        # Every forward jump not yet checked: (first offset skipped, offset delivered next).
        self.gaps: list[tuple[int, int]] = []
        self.backoff = Backoff()
        self.outage = Outage(options.connection.outage_timeout, options.connection.display_uri)
        self.shortfall = Shortfall(options.connection.outage_timeout)
        self.connecting = False
        self.connect_began = time.monotonic()
        self._refused = (-1, 0)  # (offset, how many 541s in a row there)
        self.row_filter = filtering.RowFilter(options.filter, options.match_unfiltered) if options.filter else None
        self.broker_filter = filtering.consumer_arguments(options)
        self.widened = False  # the broker's filter takes the range's last message in too
        self.widen_due = False
        # The rows the caller asked for. Credit goes back only while fewer are held (``full``), and the rest when
        # the caller asks again (``_refill``): every await in the loop (a check, a reconnect) reads on, and a
        # task's memory must not grow to the whole range while Spark has not taken the rows.
        self.limit = 1

    def _use_core(self, conversion: Conversion) -> None:
        """Make the rows with the compiled core from now on where it serves ``conversion`` (with the row filter and the
        columns the query asks for), else in Python (``RowMaker``)."""
        f = self.row_filter
        values, unfiltered = (None, False) if f is None else (f.values, f.match_unfiltered)
        self.rows.use(core.builder(self.part.stream, conversion, values, unfiltered, self.options.made))

    @property
    def exhausted(self) -> bool:
        """Nothing more to hand out: the range is done, every row is out and every jump is checked. The loop
        can run a few more callbacks after ``next_rows`` returns, so rows and jumps may come after it (a jump
        past the range's end also ends the range, and unchecked it would end it short without a word)."""
        return self.done and not self.rows and not self.gaps

    async def _connect(self) -> None:
        raise NotImplementedError

    async def _subscribe(self) -> None:
        raise NotImplementedError

    async def _unsubscribe(self) -> None:
        raise NotImplementedError

    def _patience(self, timeout: float) -> float:
        """How long to wait for a delivery before ``_silent_a_while``."""
        return timeout

    async def _silent_a_while(self) -> bool:
        """Nothing came within ``_patience``: whether to wait on (else the broker is silent: ``_silent``)."""
        return False

    async def _unseen(self, start: int, stop: int) -> None:
        """Offsets ``start`` to ``stop - 1`` the stream still holds did not come: a reader that can tell why checks here."""

    @property
    def full(self) -> bool:
        """Rows enough for the caller: credit the broker uses up now is given back in ``_refill``."""
        return len(self.rows) >= self.limit

    def _refill(self) -> None:
        """Give back the credit held back while ``full``."""

    async def next_rows(self, limit: int) -> list[pa.RecordBatch]:
        timeout = self.options.connection.connection_timeout
        self.limit = limit
        self._refill()
        while self.gaps or (len(self.rows) < limit and not self.done):
            try:
                if self.client is None:
                    self.connecting = True  # a failure now reached no endpoint (the Outage of a retried task asks)
                    self.connect_began = time.monotonic()
                    await self._connect()
                    self.connecting = False
                if self.gaps:  # before more rows go out: a loss must fail the task before the rows after it
                    await self._check_gaps()
                    continue
                if self.widen_due:  # here, where a failure to ask is retried as any other
                    await self._widen_filter()
                    continue
                if not self.subscribed:
                    await self._subscribe()
                self.arrived.clear()
                if self.failure is None and not self.done and len(self.rows) < limit:
                    # The planner saw these offsets in the stream: a silent broker is a fault, not an end.
                    await asyncio.wait_for(self.arrived.wait(), FILTER_IDLE if self._may_widen else self._patience(timeout))
                if self.failure is not None:
                    raise self.failure
            except TimeoutError:
                if self._may_widen:
                    self.widen_due = True
                    continue
                if await self._silent_a_while():
                    continue
                await self._silent(timeout)
            except AmqpSourceError:
                raise
            except Exception as err:
                if not is_transient(err):
                    raise self._explained(err) from err
                await self._check_repeated_refusal(err)
                await self._resume(err)
        return self.rows.take()

    async def close(self) -> None:
        client, self.client, self.subscribed = self.client, None, False
        if client is not None:
            await client.close()

    @property
    def _may_widen(self) -> bool:
        """Whether silence means 'the broker skipped to the end' (see FILTER_IDLE) rather than a fault."""
        return bool(self.broker_filter) and not self.widened

    async def _widen_filter(self) -> None:
        """From the first offset not yet read, also ask the broker for the value of the range's last message
        (or for messages without one): the chunk holding it then comes for sure, and the range sees its end.
        Rows are still filtered here, so only the chunks sent change."""
        assert self.client is not None
        last = await self.access.filter_value_at(self.client, self.part.stream, self.part.end - 1)
        arguments = dict(self.broker_filter)
        if last is None:
            arguments = {}  # nothing there now: read on unfiltered, and _silent says what became of it
        elif last[1] is None:
            arguments["x-stream-match-unfiltered"] = True
        else:
            arguments["x-stream-filter"] = list(dict.fromkeys([*self.options.filter, last[1]]))
        log.debug(
            "AMQP source: stream '%s': nothing matched the filter for %gs; reading on from offset %d with %s",
            self.part.stream,
            FILTER_IDLE,
            self.next_offset,
            arguments or "no filter",
        )
        self.broker_filter, self.widened, self.widen_due = arguments, True, False
        await self._unsubscribe()

    def _offered(self, offset: int) -> bool:
        """Bookkeeping for a message at ``offset`` that just arrived: whether it is in the range and new (the
        caller then makes its row). Jumps forward are noted for ``_check_gaps``, and the end closes the range."""
        if offset < self.next_offset:
            return False  # a chunk starts before the offset asked for
        if offset > self.next_offset:
            # Retention removed what comes next (at the start, or under a reader that fell behind:
            # RabbitMQ moves it to the oldest segment left), or the offsets in between hold no
            # messages (the tracking chunk RabbitMQ starts each segment with). Checked before
            # more rows go out, even when the jump lands past the range's end.
            self.gaps.append((self.next_offset, offset))
        end = self.part.end
        taken = offset < end
        if taken:
            self.next_offset = offset + 1
            if self.backoff.failures:
                self.backoff.reset()
                self.outage.recovered()
        if offset >= end - 1:
            self.done = True
        return taken

    async def _check_gaps(self) -> None:
        """Data loss only where the stream now begins after a skipped offset; a gap is dropped only once checked."""
        assert self.client is not None
        head = await self.access.head(self.client, self.part.stream)
        while self.gaps:
            start, first = self.gaps[0]
            verdict = judge_gap(self.part, start, first, head)
            if verdict is None and min(first, self.part.end) > start:
                await self._unseen(start, min(first, self.part.end))
            if verdict is not None:
                lost, certain = verdict
                message = (
                    f"stream '{self.part.stream}': offsets {start} to {start + lost - 1} ({lost}) were removed by the stream's "
                    "retention (x-max-length-bytes / x-max-age) before this query read them"
                )
                if certain:
                    if self.options.fail_on_data_loss:
                        raise AmqpSourceError(message + "; set failOnDataLoss=false to skip them and go on")
                    log.warning("AMQP source: %s; skipped (failOnDataLoss=false)", message)
                else:
                    log.warning(
                        "AMQP source: %s, or they held no messages (RabbitMQ gives the tracking chunk that opens a segment an "
                        "offset of its own, and retention has since removed that segment): not treated as data loss",
                        message,
                    )
            self.gaps.pop(0)

    async def _silent(self, timeout: float) -> None:
        """No delivery for ``timeout`` seconds, although the planner saw these offsets: a stalled connection,
        or a stream deleted and declared again since (its offsets start over). Asking where it ends tells which."""
        silent = ConnectionLost(f"no delivery for {timeout:g}s at offset {self.next_offset} (this batch reads up to {self.part.end - 1})")
        end: int | None = None  # where the stream ends now, if the broker says
        if self.client is not None and not self.client.closed.done():
            try:
                last = await self.access.tail(self.client, self.part.stream)
                end = 0 if last is None else last[0] + 1
            except Unchecked:
                pass  # where it ends cannot be told now: waited out below as a stalled connection is
            except AmqpSourceError:
                raise
            except Exception as err:
                if not is_transient(err):
                    raise self._explained(err) from err
        if end is not None:
            said = (
                f"stream '{self.part.stream}' now ends at offset {end}, but this batch reads it from {self.next_offset} up to "
                f"{self.part.end - 1}, which it held when the batch was planned"
            )
            if self.shortfall.short(self.part.stream, end, self.next_offset + 1, said):
                # Reconnecting may reach another member; a lasting shortfall fails above, naming itself, before the outage.
                silent = ConnectionLost(f"{said} (a member catching up, or the stream deleted and declared again)")
                self.outage.recovered()
        await self._resume(silent)

    async def _check_repeated_refusal(self, err: BaseException) -> None:
        """RabbitMQ 4.x closes the connection with 541 when it cannot convert a stream message for AMQP 0-9-1:
        the same offset fails every time, so retrying without end would hide a permanent fault."""
        if not isinstance(err, InternalError):
            self._refused = (-1, 0)
            return
        at, times = self._refused
        times = times + 1 if at == self.next_offset else 1
        self._refused = (self.next_offset, times)
        if times >= REFUSALS_AT_ONE_OFFSET:
            await self._unseen(self.next_offset, self.part.end)  # RabbitMQ 3.10 closes it so at a compressed sub-entry
            raise AmqpSourceError(
                f"stream '{self.part.stream}': the broker closed the connection with {err} {times} times when reading offset "
                f"{self.next_offset}. Most likely the message there is not AMQP 1.0: written by a stream-protocol client in "
                "binary mode (rstream, for one), which RabbitMQ 4.x cannot convert for an AMQP 0-9-1 consumer (its log says "
                "primitive_type_unsupported). Read this stream with a stream-protocol client, or write AMQP 1.0 messages"
            ) from err

    async def _resume(self, err: BaseException) -> None:
        """Read again after the last offset read, once the backoff's delay has passed. The planner reached the
        broker before this task was planned, so an outage is waited out, with a warning each time, for up to
        brokerOutageTimeout (then the task fails, naming each endpoint's last error, and Spark retries it)."""
        self.outage.failed(err, unreachable=self.connecting, heard=self._heard(), tried=self.connect_began)
        self.connecting = False
        self.outage.check()
        delay = min(self.backoff.next(), self.outage.left())  # the last attempt starts in time
        log.warning(
            "AMQP source: reading stream '%s' from offset %d again in %.1fs (attempt %d) after: %s",
            self.part.stream,
            self.next_offset,
            delay,
            self.backoff.failures,
            err,
        )
        client, self.client, self.subscribed = self.client, None, False
        if client is not None:
            client.abort(ConnectionLost("resuming"))
        await asyncio.sleep(delay)

    def _heard(self) -> float | None:
        """When the connection that failed last heard from its broker (None: none was open)."""
        return None if self.client is None else float(self.client.last_heard)

    def _explained(self, err: BaseException) -> AmqpSourceError:
        c = self.options.connection
        return AmqpSourceError(explain(err, c.display_uri, c.username, c.vhost, f"stream '{self.part.stream}'"))
