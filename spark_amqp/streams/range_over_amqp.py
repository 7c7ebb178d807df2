"""Reading a stream range over AMQP 0-9-1: a basic.consume at the range's first offset.

Credit goes back as acks (on a stream an ack deletes nothing) every
prefetch/``ACK_SHARE`` messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from ..client import AmqpClient, ClientChannel
from ..errors import Unchecked
from ..reading import stream_consumers
from ..reading.stream_consumers import not_a_stream, stream_offset
from ..stream_protocol.client import OffsetSpec
from ..transport.backoff import Backoff
from ..transport.outage import Outage
from .compressed import CompressedCheck, UncheckedRefused
from .options import StreamSourceOptions
from .range_base import RangeReader
from .ranges import StreamRange
from .waits import CHECK_AFTER

__all__ = ["ACK_SHARE", "AmqpRangeReader"]

# Credit goes back every prefetch/ACK_SHARE messages. RabbitMQ 3.10 refills a stream consumer
# in its channel process with work that grows faster than the ack's size (docs/streams.md, "How a
# batch is planned and read"): one consumer read 57-63k msg/s acking every 1000 of 2000,
# 75-85k acking every 125.
ACK_SHARE = 16
log = logging.getLogger("spark_amqp.streams")
_tags = itertools.count(1)


class AmqpRangeReader(RangeReader):
    def __init__(self, options: StreamSourceOptions, part: StreamRange) -> None:
        super().__init__(options, part)
        self.channel: ClientChannel | None = None
        self.unacked = 0
        self.last_tag = 0
        self.credit = max(1, min(options.prefetch, part.size))
        # RabbitMQ does not deliver compressed sub-entries over AMQP 0-9-1: offsets that do not come are checked.
        self.compressed = CompressedCheck(options.connection, options.fail_on_data_loss)
        self._checked_at = -1  # the offset a silence was last checked at
        # Where the stream protocol cannot be asked, asked again with backoff, up to brokerOutageTimeout (``_asked``).
        self.unchecked = Outage(options.connection.outage_timeout, self.compressed.options.display_uri)
        self._unchecked_at = -1  # the offset the questions that got no answer are about
        self._check_backoff = Backoff()

    async def _connect(self) -> None:
        self.client = await AmqpClient.connect(
            self.outage.attempt_options(self.options.connection), f"spark-amqp stream reader {self.part.stream}"
        )
        await self.access.require(self.client, self.options)

    async def _subscribe(self) -> None:
        channel = self.channel = await self.client.channel()
        self.subscribed = True
        self.failure, self.unacked = None, 0
        channel.on_delivery = self._on_delivery
        channel.closed.add_done_callback(self._on_closed)
        tag = f"spark-amqp-range-{next(_tags)}"
        await stream_consumers.consume(channel, self.part.stream, tag, self.next_offset, self.credit, self.broker_filter)

    async def _unsubscribe(self) -> None:
        # Deliveries that come before the close-ok are still read (in order): the next consumer starts after them.
        channel, self.channel, self.subscribed = self.channel, None, False
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        self.channel = None
        await self.compressed.close()
        await super().close()

    def _patience(self, timeout: float) -> float:
        return min(timeout, CHECK_AFTER) if self._checked_at != self.next_offset else timeout

    async def _silent_a_while(self) -> bool:
        if self._checked_at == self.next_offset:
            return False
        self._checked_at = self.next_offset
        # The chunk that holds the offset awaited is enough: a compressed sub-entry there is why nothing comes. A silence
        # proves nothing (a slow broker, a failover): where the question cannot be asked, the read waits on as before
        # it, and what then comes after a jump, or never, is checked (``_unseen``, ``_silent``).
        try:
            await self.compressed.refuse(self.part.stream, OffsetSpec.offset(self.next_offset), before=self.part.end, scan=False)
        except (Unchecked, UncheckedRefused) as err:
            log.debug("AMQP source: %s", err)
        return True

    async def _unseen(self, start: int, stop: int) -> None:
        if self.broker_filter.get("x-stream-filter") and not self.broker_filter.get("x-stream-match-unfiltered"):
            # Chunks whose Bloom filter has none of the values: the broker skips them whole, and no message in them is
            # one the read keeps. RabbitMQ's clients give sub-entries no filter value, so a compressed one is in a chunk
            # sent only to a read that matches unfiltered messages too: that read still asks.
            return
        while (delay := await self._asked(start, stop)) is not None:
            await asyncio.sleep(delay)

    async def _asked(self, start: int, stop: int) -> float | None:
        """None once the stream protocol told what offsets ``start`` to ``stop - 1`` hold (``CompressedSubEntry`` if a
        compressed sub-entry); while it cannot be asked, how long to wait before asking again, until that has lasted
        brokerOutageTimeout (then the error says what was not delivered and what to change)."""
        if self._unchecked_at != start:
            self._unchecked_at = start
            self.unchecked.recovered()
            self._check_backoff.reset()
        try:
            within = self.unchecked.left() if self.unchecked.down else None  # the last attempt ends by the deadline
            await self.compressed.refuse(self.part.stream, OffsetSpec.offset(start), before=stop, within=within)
        except Unchecked as err:
            self.unchecked.failed(err)
            self.unchecked.check()
            delay = min(self._check_backoff.next(), self.unchecked.left())
            log.warning("AMQP source: %s; asking again in %.1fs", err, delay)
            return delay
        self.unchecked.recovered()
        self._check_backoff.reset()
        return None

    async def _resume(self, err: BaseException) -> None:
        self.channel = None
        await super()._resume(err)

    def _on_closed(self, closed: asyncio.Future[Any]) -> None:
        reason = closed.result()
        if reason is not None and self.failure is None and not self.done:
            self.failure = reason
            self.arrived.set()

    def _refill(self) -> None:
        if self.unacked and self.channel is not None:  # None: closing, credit no longer needed
            self.channel.ack(self.last_tag, True)
            self.unacked = 0

    def _on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str, props: Any, body: bytes) -> None:
        if self.done or self.failure is not None:
            return
        offset = stream_offset(props)
        if offset is None:  # never ack it: on a classic queue an ack deletes
            self.failure = not_a_stream(self.part.stream)
            self.arrived.set()
            return
        self.unacked += 1
        self.last_tag = tag
        if self.unacked * ACK_SHARE >= self.credit and not self.full:
            self._refill()
        if self._offered(offset) and (self.row_filter is None or self.row_filter.keeps(props)):
            self.rows.append((body, self.part.stream, exchange, routing_key, offset, props))
        self.arrived.set()
