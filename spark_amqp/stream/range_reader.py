"""Reading one offset range of a stream, in an executor task, with a connection of its own.

The consumer starts at the range's first offset and gives credit back (acks
grant credit on a stream; nothing is deleted) as rows come in. It stops at the
range's last offset and drops whatever a chunk brought beyond it, so a task
never yields an offset outside its range, and a replay yields the same rows.
A lost connection resumes after the last offset read.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel
from ..errors import AmqpSourceError, ConnectionLost, explain, is_transient
from ..source import arrow
from ..stream_options import StreamSourceOptions
from . import probe
from .probe import not_a_stream, stream_offset
from .ranges import StreamRange, judge_gap

__all__ = ["ACK_SHARE", "BATCH_ROWS", "read_range"]

log = logging.getLogger("spark_amqp.stream")

BATCH_ROWS = 10_000
MAX_RESUMES = 5
# Credit goes back every prefetch/ACK_SHARE messages. RabbitMQ 3.10 refills a stream consumer
# in its channel process with work that grows faster than the ack's size (README, "How a
# batch is planned and read"): one consumer read 57-63k msg/s acking every 1000 of 2000,
# 75-85k acking every 125.
ACK_SHARE = 16
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
        self.resumes = 0
        self.credit = max(1, min(options.prefetch, part.size))

    async def next_rows(self, limit: int) -> list[tuple[bytes, str, str, str, int, Any]]:
        timeout = self.options.connection.connection_timeout
        while self.gaps or (len(self.rows) < limit and not self.done):
            try:
                if self.client is None:
                    await self._connect()
                if self.gaps:  # before more rows go out: a loss must fail the task before the rows after it
                    await self._check_gaps()
                    continue
                if self.channel is None:
                    await self._subscribe()
                self.arrived.clear()
                if self.failure is None and not self.done and len(self.rows) < limit:
                    # The planner saw these offsets in the stream: a silent broker is a fault, not an end.
                    await asyncio.wait_for(self.arrived.wait(), timeout)
                if self.failure is not None:
                    raise self.failure
            except asyncio.TimeoutError:
                # The planner saw offsets up to the range's end; if they never come, the stream was
                # probably deleted and declared again since.
                silent = f"no delivery for {timeout:g}s at offset {self.next_offset} (this batch reads up to {self.part.end - 1})"
                await self._resume(ConnectionLost(silent))
            except AmqpSourceError:
                raise
            except Exception as err:
                if not is_transient(err):
                    raise self._explained(err) from err
                await self._resume(err)
        rows, self.rows = self.rows, []
        return rows

    async def close(self) -> None:
        client, self.client, self.channel = self.client, None, None
        if client is not None:
            await client.close()

    async def _connect(self) -> None:
        self.client = await AmqpClient.connect(self.options.connection, f"spark-amqp stream reader {self.part.stream}")

    async def _subscribe(self) -> None:
        assert self.client is not None
        channel = self.channel = await self.client.channel()
        self.failure, self.unacked = None, 0
        channel.on_delivery = self._on_delivery
        channel.closed.add_done_callback(self._on_closed)
        await channel.rpc(framing.build(commands.Basic.Qos, prefetch_count=self.credit))
        await probe.consume(channel, self.part.stream, f"spark-amqp-range-{next(_tags)}", self.next_offset)

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
        if self.unacked * ACK_SHARE >= self.credit:
            assert self.channel is not None
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
            self.rows.append((body, self.part.stream, exchange, routing_key, offset, props))
            self.next_offset = offset + 1
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

    async def _resume(self, err: BaseException) -> None:
        self.resumes += 1
        if self.resumes > MAX_RESUMES:
            raise self._explained(err) from err
        log.warning("AMQP source: reading stream '%s' from offset %d again after: %s", self.part.stream, self.next_offset, err)
        client, self.client, self.channel = self.client, None, None
        if client is not None:
            client.abort(ConnectionLost("resuming"))
        await asyncio.sleep(min(0.2 * 2**self.resumes, 5.0))

    def _explained(self, err: BaseException) -> AmqpSourceError:
        c = self.options.connection
        return AmqpSourceError(explain(err, c.display_uri, c.username, c.vhost, f"stream '{self.part.stream}'"))
