"""Reading one offset range of a stream, in an executor task, with a connection of its own.

The consumer starts at the range's first offset and gives credit back (acks
grant credit on a stream; nothing is deleted) as rows come in. It stops at the
range's last offset and drops whatever a chunk brought beyond it, so a task
never yields an offset outside its range, and a replay yields the same rows.
A lost connection resumes after the last offset read, with backoff and
without a deadline (the planner reached the broker before the task was
planned): a broker restart only delays the task.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..backoff import Backoff
from ..client import AmqpClient, ClientChannel
from ..errors import AmqpSourceError, ConnectionLost, InternalError, explain, is_transient
from ..reading import arrow, stream_consumers
from ..reading.stream_consumers import not_a_stream, stream_offset
from . import filtering, probe
from .options import StreamSourceOptions
from .ranges import StreamRange, judge_gap

__all__ = ["ACK_SHARE", "BATCH_ROWS", "read_range"]

log = logging.getLogger("spark_amqp.streams")

BATCH_ROWS = 10_000
# A 541 at one offset this many times in a row is the message, not the broker.
REFUSALS_AT_ONE_OFFSET = 3
# Credit goes back every prefetch/ACK_SHARE messages. RabbitMQ 3.10 refills a stream consumer
# in its channel process with work that grows faster than the ack's size (README, "How a
# batch is planned and read"): one consumer read 57-63k msg/s acking every 1000 of 2000,
# 75-85k acking every 125.
ACK_SHARE = 16
# With a filter, the broker skips the chunks that match nothing without a word, so a range whose last
# offsets match nothing would never see its end. After this long without a delivery, the filter takes in
# the value of the range's last message as well (see _widen_filter): a slow broker costs some chunks more.
FILTER_IDLE = 0.25
_tags = itertools.count(1)


def read_range(options: StreamSourceOptions, part: StreamRange, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the range's messages, in offset order."""
    loop = asyncio.new_event_loop()
    reader = _RangeReader(options, part)
    try:
        # The loop can run a few more callbacks after next_rows returns, so rows may
        # arrive (and the range end) between calls: stop only once they are all out.
        while not reader.done or reader.rows:
            rows = loop.run_until_complete(reader.next_rows(batch_rows))
            if rows:
                yield arrow.to_stream_batch(rows)
    finally:
        loop.run_until_complete(reader.close())
        loop.close()


class _RangeReader:
    def __init__(self, options: StreamSourceOptions, part: StreamRange) -> None:
        self.options = options
        self.part = part
        self.next_offset = part.start  # the first offset not yet read
        self.done = part.size <= 0
        self.rows: list[tuple[bytes, str, str, str, int, Any]] = []
        self.client: AmqpClient | None = None
        self.channel: ClientChannel | None = None
        self.failure: BaseException | None = None
        self.arrived = asyncio.Event()
        self.unacked = 0
        # Every forward jump not yet checked: (first offset skipped, offset delivered next).
        self.gaps: list[tuple[int, int]] = []
        self.backoff = Backoff()
        self._refused = (-1, 0)  # (offset, how many 541s in a row there)
        self.credit = max(1, min(options.prefetch, part.size))
        self.row_filter = filtering.RowFilter(options.filter, options.match_unfiltered) if options.filter else None
        self.broker_filter = filtering.consumer_arguments(options)
        self.widened = False  # the broker's filter takes the range's last message in too
        self.widen_due = False

    async def next_rows(self, limit: int) -> list[tuple[bytes, str, str, str, int, Any]]:
        timeout = self.options.connection.connection_timeout
        while self.gaps or (len(self.rows) < limit and not self.done):
            try:
                if self.client is None:
                    await self._connect()
                if self.gaps:  # before more rows go out: a loss must fail the task before the rows after it
                    await self._check_gaps()
                    continue
                if self.widen_due:  # here, where a failure to ask is retried as any other
                    await self._widen_filter()
                    continue
                if self.channel is None:
                    await self._subscribe()
                self.arrived.clear()
                if self.failure is None and not self.done and len(self.rows) < limit:
                    # The planner saw these offsets in the stream: a silent broker is a fault, not an end.
                    await asyncio.wait_for(self.arrived.wait(), FILTER_IDLE if self._may_widen else timeout)
                if self.failure is not None:
                    raise self.failure
            except asyncio.TimeoutError:
                if self._may_widen:
                    self.widen_due = True
                    continue
                await self._silent(timeout)
            except AmqpSourceError:
                raise
            except Exception as err:
                if not is_transient(err):
                    raise self._explained(err) from err
                self._check_repeated_refusal(err)
                await self._resume(err)
        rows, self.rows = self.rows, []
        return rows

    async def close(self) -> None:
        client, self.client, self.channel = self.client, None, None
        if client is not None:
            await client.close()

    async def _connect(self) -> None:
        self.client = await AmqpClient.connect(self.options.connection, f"spark-amqp stream reader {self.part.stream}")
        await filtering.require(self.client, self.options)

    async def _subscribe(self) -> None:
        assert self.client is not None
        channel = self.channel = await self.client.channel()
        self.failure, self.unacked = None, 0
        channel.on_delivery = self._on_delivery
        channel.closed.add_done_callback(self._on_closed)
        tag = f"spark-amqp-range-{next(_tags)}"
        await stream_consumers.consume(channel, self.part.stream, tag, self.next_offset, self.credit, self.broker_filter)

    @property
    def _may_widen(self) -> bool:
        """Whether silence means 'the broker skipped to the end' (see FILTER_IDLE) rather than a fault."""
        return bool(self.broker_filter) and not self.widened

    async def _widen_filter(self) -> None:
        """From the first offset not yet read, also ask the broker for the value of the range's last message
        (or for messages without one): the chunk holding it then comes for sure, and the range sees its end.
        Rows are still filtered here, so only the chunks sent change."""
        assert self.client is not None
        last = await probe.filter_value_at(self.client, self.part.stream, self.part.end - 1)
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
        # Deliveries that come before the close-ok are still read (in order): the next consumer starts after them.
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.close()

    def _on_closed(self, closed: asyncio.Future[Any]) -> None:
        reason = closed.result()
        if reason is not None and self.failure is None and not self.done:
            self.failure = reason
            self.arrived.set()

    def _on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str, props: Any, body: bytes) -> None:
        if self.done or self.failure is not None:
            return
        offset = stream_offset(props)
        if offset is None:  # never ack it: on a classic queue an ack deletes
            self.failure = not_a_stream(self.part.stream)
            self.arrived.set()
            return
        self.unacked += 1
        if self.unacked * ACK_SHARE >= self.credit and self.channel is not None:  # None: closing, credit no longer needed
            self.channel.ack(tag, True)
            self.unacked = 0
        if offset < self.next_offset:
            return  # a chunk starts before the offset asked for
        if offset > self.next_offset:
            # Retention removed what comes next (at the start, or under a reader that fell behind:
            # RabbitMQ moves it to the oldest segment left), or the offsets in between hold no
            # messages (the tracking chunk RabbitMQ starts each segment with). Checked before
            # more rows go out, even when the jump lands past the range's end.
            self.gaps.append((self.next_offset, offset))
        end = self.part.end
        if offset < end:
            if self.row_filter is None or self.row_filter.keeps(props):
                self.rows.append((body, self.part.stream, exchange, routing_key, offset, props))
            self.next_offset = offset + 1
            if self.backoff.failures:
                self.backoff.reset()
        if offset >= end - 1:
            self.done = True
        self.arrived.set()

    async def _check_gaps(self) -> None:
        """Data loss only where the stream now begins after a skipped offset; a gap is dropped only once checked."""
        assert self.client is not None
        head = await probe.head(self.client, self.part.stream)
        while self.gaps:
            start, first = self.gaps[0]
            verdict = judge_gap(self.part, start, first, head)
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
                last = await probe.tail(self.client, self.part.stream)
                end = 0 if last is None else last[0] + 1
            except Exception as err:
                if not is_transient(err):
                    raise self._explained(err) from err
        if end is not None and end <= self.next_offset:
            raise AmqpSourceError(
                f"stream '{self.part.stream}' now ends at offset {end}, but this batch reads it from {self.next_offset} up to "
                f"{self.part.end - 1}, which it held when the batch was planned: the stream was deleted and declared again "
                "(or retention removed everything). Start the query with a new checkpointLocation"
            )
        await self._resume(silent)

    def _check_repeated_refusal(self, err: BaseException) -> None:
        """RabbitMQ 4.x closes the connection with 541 when it cannot convert a stream message for AMQP 0-9-1:
        the same offset fails every time, so retrying without end would hide a permanent fault."""
        if not isinstance(err, InternalError):
            self._refused = (-1, 0)
            return
        at, times = self._refused
        times = times + 1 if at == self.next_offset else 1
        self._refused = (self.next_offset, times)
        if times >= REFUSALS_AT_ONE_OFFSET:
            raise AmqpSourceError(
                f"stream '{self.part.stream}': the broker closed the connection with {err} {times} times when reading offset "
                f"{self.next_offset}. Most likely the message there is not AMQP 1.0: written by a stream-protocol client in "
                "binary mode (rstream, for one), which RabbitMQ 4.x cannot convert for an AMQP 0-9-1 consumer (its log says "
                "primitive_type_unsupported). Read this stream with a stream-protocol client, or write AMQP 1.0 messages"
            ) from err

    async def _resume(self, err: BaseException) -> None:
        """Read again after the last offset read, once the backoff's delay has passed. The planner reached the
        broker before this task was planned, so an outage is waited out, however long, with a warning each time."""
        delay = self.backoff.next()
        log.warning(
            "AMQP source: reading stream '%s' from offset %d again in %.1fs (attempt %d) after: %s",
            self.part.stream,
            self.next_offset,
            delay,
            self.backoff.failures,
            err,
        )
        client, self.client, self.channel = self.client, None, None
        if client is not None:
            client.abort(ConnectionLost("resuming"))
        await asyncio.sleep(delay)

    def _explained(self, err: BaseException) -> AmqpSourceError:
        c = self.options.connection
        return AmqpSourceError(explain(err, c.display_uri, c.username, c.vhost, f"stream '{self.part.stream}'"))
