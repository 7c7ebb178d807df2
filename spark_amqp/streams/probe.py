"""A stream's ends, asked of the broker without reading its data.

A consumer that starts at ``last`` gets the stream's last chunk, ``first`` its
oldest message, a timestamp the first chunk written at or after it. What makes
this hold on every RabbitMQ line (measured on 3.10.8, 4.0.5 and 4.3.6, and read
in ``rabbit_stream_queue``):

* RabbitMQ reads nothing while it handles ``basic.consume``. A new stream
  consumer's first deliveries are read when the stream's member tells the
  channel where its log ends, which normally follows at once but can take tens
  of milliseconds (right after retention deleted a segment, say). So a probe
  waits for its first delivery; a stream that sends none in that time is empty.
  ``queue.declare``'s message count says how long to wait: above 0 the stream
  has messages (the count lags by up to 5 s, so 0 proves nothing).
* What an ack makes readable is read and sent while the channel handles the ack,
  so it reaches the client before the reply to any method sent after the ack.
  3.10 sends a chunk whole whatever the prefetch; 4.x stops at the prefetch
  inside a chunk and goes on after the ack. So the tail probe acks what came,
  sends ``basic.qos`` as a barrier, and is at the end when a barrier brings
  nothing more.

A probe that gets nothing from a stream that counts messages may be at a compressed sub-entry, which RabbitMQ
does not deliver over AMQP 0-9-1 (4.x sends nothing, 3.10 closes the connection): after ``CHECK_AFTER`` of
silence, or at that 541, the stream protocol is asked (``compressed.py``). Where it cannot be asked, a probe that
still gets nothing raises ``Unchecked``: taking the stream for empty would end a read with none of its messages.

Other queue types refuse the ``x-stream-offset`` argument (406), and a delivery
without an ``x-stream-offset`` header is refused as well, never acked."""

from __future__ import annotations

import asyncio
import datetime
import itertools
from typing import Any

from pamqp import commands

from .. import framing
from ..client import AmqpClient
from ..client.properties import LazyProperties
from ..errors import InternalError, Unchecked
from ..rabbitmq import FILTER_VALUE_HEADER
from ..reading.stream_consumers import consume, not_a_stream, stream_offset
from ..stream_protocol.client import OffsetSpec
from .compressed import CompressedCheck, UncheckedRefused, undelivered
from .waits import CHECK_AFTER, EMPTY_WAIT, UNCHECKED_WAIT

__all__ = ["filter_value_at", "head", "message_at", "offset_at", "tail"]

# Credit of the tail probe: most last chunks arrive in one go, a longer one takes a few acks.
TAIL_PREFETCH = 2000
_tags = itertools.count(1)


async def tail(client: AmqpClient, stream: str) -> tuple[int, bytes] | None:
    """The offset and body of the stream's last message; None if it has none."""
    return (await _probe(client, stream, "last", TAIL_PREFETCH, to_the_end=True)).last


async def head(client: AmqpClient, stream: str) -> int | None:
    """The first offset still in the stream (retention removes whole segments from the head); None if empty."""
    found = (await _probe(client, stream, "first", 1, to_the_end=False)).first
    return None if found is None else found[0]


async def message_at(client: AmqpClient, stream: str, offset: int) -> tuple[int, bytes] | None:
    """The offset and body of the first message at or after ``offset`` (RabbitMQ skips the earlier ones
    of its chunk); None if the stream has none there."""
    return (await _probe(client, stream, offset, 1, to_the_end=False)).first


async def filter_value_at(client: AmqpClient, stream: str, offset: int) -> tuple[int, str | None] | None:
    """The offset and ``x-stream-filter-value`` (None: it has none) of the first message at or after ``offset``;
    None if the stream has none there."""
    seen = await _probe(client, stream, offset, 1, to_the_end=False)
    if seen.first is None or seen.first_props is None:
        return None
    return seen.first[0], seen.first_props.text_header(FILTER_VALUE_HEADER)


async def offset_at(client: AmqpClient, stream: str, epoch_ms: int) -> int | None:
    """The first offset of the first chunk written at or after ``epoch_ms`` (to the second); None if none is."""
    moment = datetime.datetime.fromtimestamp(epoch_ms // 1000, tz=datetime.UTC)
    found = (await _probe(client, stream, moment, 1, to_the_end=False)).first
    return None if found is None else found[0]


class _Seen:
    """How many deliveries a probe got, the first, and the one with the highest offset."""

    def __init__(self) -> None:
        self.count = 0
        self.first: tuple[int, bytes] | None = None
        self.first_props: LazyProperties | None = None
        self.last: tuple[int, bytes] | None = None

    def add(self, offset: int, body: bytes, props: LazyProperties) -> None:
        self.count += 1
        if self.first is None:
            self.first, self.first_props = (offset, body), props
        if self.last is None or offset > self.last[0]:
            self.last = (offset, body)


async def _probe(client: AmqpClient, stream: str, spec: Any, prefetch: int, to_the_end: bool) -> _Seen:
    """What a consumer from ``spec`` gets: the first delivery only, or every one up to the stream's end."""
    channel = await client.channel()
    seen = _Seen()
    last_tag = 0
    foreign = False
    arrived = asyncio.Event()

    def on_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: Any, body: bytes) -> None:
        nonlocal foreign, last_tag
        offset = stream_offset(props)
        if offset is None:
            foreign = True
        else:
            seen.add(offset, body, props)
        last_tag = tag
        arrived.set()

    channel.on_delivery = on_delivery
    tag = f"spark-amqp-probe-{next(_tags)}"
    qos = framing.build(commands.Basic.Qos, prefetch_count=prefetch)
    try:
        declared = await channel.rpc(framing.build(commands.Queue.Declare, queue=stream, passive=True))
        await consume(channel, stream, tag, spec, prefetch)
        patience = client.options.connection_timeout if declared.message_count else EMPTY_WAIT
        try:
            await asyncio.wait_for(arrived.wait(), min(patience, CHECK_AFTER) if declared.message_count else patience)
        except TimeoutError:
            # Messages, and none comes (or a tail that finds none, where the count lags by up to 5 s): compressed ones
            # there, or a slow broker. Else an empty stream, or one that has nothing at or after that moment.
            if declared.message_count or to_the_end:
                await _unless_compressed(client, stream, spec, declared.message_count, arrived)
            if declared.message_count:
                try:
                    await asyncio.wait_for(arrived.wait(), patience)
                except TimeoutError:
                    pass
        counted = 0
        while to_the_end and seen.count > counted and not foreign:
            counted = seen.count
            channel.ack(last_tag, True)
            await channel.rpc(qos)  # a barrier: what the ack made readable comes before its reply
        await channel.rpc(framing.build(commands.Basic.Cancel, consumer_tag=tag))
    except InternalError:  # RabbitMQ 3.10 closes the connection with 541 at a compressed sub-entry
        await _refuse_compressed(client, stream, spec, 0)
        raise
    finally:
        await channel.close()
    if foreign:
        raise not_a_stream(stream)
    return seen


async def _unless_compressed(client: AmqpClient, stream: str, spec: Any, count: int, arrived: asyncio.Event) -> None:
    """Nothing came: raises ``CompressedSubEntry`` if a compressed sub-entry is why. Where the stream protocol cannot be
    asked, a stream that counts messages but sends none for ``UNCHECKED_WAIT`` more raises ``Unchecked``: taking it for
    empty would end a read with none of its messages. One whose count reads 0 is empty (the count lags a first write by
    up to 5 s: docs/streams.md says so)."""
    try:
        await _refuse_compressed(client, stream, spec, count)
    except (Unchecked, UncheckedRefused) as unchecked:
        if not count:
            return
        if spec not in ("first", "last"):
            # A consumer from an offset or a moment reads on to the stream's end, so if the end is delivered, nothing
            # came because nothing is there; ``tail`` raises ``Unchecked`` where the end is not delivered either.
            await tail(client, stream)
            return
        try:
            await asyncio.wait_for(arrived.wait(), UNCHECKED_WAIT)  # a slow broker's delivery, after all
        except TimeoutError:
            raise unchecked from None


async def _refuse_compressed(client: AmqpClient, stream: str, spec: Any, count: int) -> None:
    """Raises ``CompressedSubEntry`` if what a probe at ``spec`` did not get is a compressed sub-entry (``Unchecked`` if
    that cannot be asked); ``count``: the stream's message count."""
    if spec == "first":
        at = OffsetSpec.FIRST
    elif spec == "last":
        at = OffsetSpec.LAST
    elif isinstance(spec, datetime.datetime):
        at = OffsetSpec.timestamp(int(spec.timestamp() * 1000))
    else:
        at = OffsetSpec.offset(int(spec))
    missing = undelivered(at, None) + (f" (the stream counts {count} messages)" if count else "")
    await CompressedCheck.for_client(client).refuse(stream, at, missing=missing)
