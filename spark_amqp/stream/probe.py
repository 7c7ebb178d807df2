"""A stream's ends, asked of the broker without reading its data.

RabbitMQ 3.10 (measured, see ARCHITECTURE.md) sends a consumer that starts at
``last`` the stream's whole last chunk, whatever its prefetch, and sends it
before the ``basic.cancel-ok`` of a cancel made right after ``consume-ok``.
So one consumer with prefetch 1 that starts at ``last`` and is cancelled at
once tells where the stream ends, for one chunk on the wire whatever the
stream holds (``tails`` keeps even that for when something was written).
``first`` and a timestamp work the same way for where the stream (or the
data since then) begins. Other queue types refuse the ``x-stream-offset``
argument (406), and a delivery without an ``x-stream-offset`` header is
refused as well, never acked."""

from __future__ import annotations

import asyncio
import datetime
import itertools
from collections.abc import Callable
from typing import Any

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel
from ..client.properties import LazyProperties
from ..errors import AmqpSourceError, PreconditionFailed

__all__ = ["GRACE", "consume", "head", "not_a_stream", "offset_at", "stream_offset", "tail"]

# How long a probe waits for its delivery before cancelling. On RabbitMQ 3.10 the
# cancel-ok already orders it; this covers brokers that deliver asynchronously.
GRACE = 0.02
_tags = itertools.count(1)


def stream_offset(props: LazyProperties) -> int | None:
    """The delivery's stream offset, taken out of its headers (the ``offset`` column holds it)."""
    return props.pop_long_header("x-stream-offset")


def not_a_stream(stream: str, refusal: BaseException | None = None) -> AmqpSourceError:
    why = f"the broker refused a stream offset for it: {refusal}" if refusal else "its deliveries carry no x-stream-offset header"
    return AmqpSourceError(
        f"queue '{stream}' is not a stream queue ({why}), so it was not read "
        "and nothing was acknowledged: read classic and quorum queues with option 'queue', or declare a stream with "
        "x-queue-type=stream"
    )


async def tail(client: AmqpClient, stream: str) -> int | None:
    """The offset of the stream's last message; None if it has none."""
    return await _probe(client, stream, "last", max)


async def head(client: AmqpClient, stream: str) -> int | None:
    """The first offset still in the stream (retention removes whole segments from the head); None if empty."""
    return await _probe(client, stream, "first", min)


async def offset_at(client: AmqpClient, stream: str, epoch_ms: int) -> int | None:
    """The first offset of the first chunk written at or after ``epoch_ms`` (to the second); None if none is."""
    moment = datetime.datetime.fromtimestamp(epoch_ms // 1000, tz=datetime.timezone.utc)
    return await _probe(client, stream, moment, min)


async def consume(channel: ClientChannel, stream: str, tag: str, offset: Any) -> None:
    """basic.consume from ``offset`` (basic.qos must come first: streams require a prefetch)."""
    try:
        await channel.rpc(framing.build(commands.Basic.Consume, queue=stream, consumer_tag=tag, arguments={"x-stream-offset": offset}))
    except PreconditionFailed as err:
        if "x-stream-offset" in err.text:  # RabbitMQ refuses the argument on other queue types
            raise not_a_stream(stream, err) from None
        raise


async def _probe(client: AmqpClient, stream: str, spec: Any, pick: Callable[[list[int]], int]) -> int | None:
    channel = await client.channel()
    offsets: list[int] = []
    foreign = False
    arrived = asyncio.Event()

    def on_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: Any, body: bytes) -> None:
        nonlocal foreign
        offset = stream_offset(props)
        if offset is None:
            foreign = True
        else:
            offsets.append(offset)
        arrived.set()

    channel.on_delivery = on_delivery
    tag = f"spark-amqp-probe-{next(_tags)}"
    try:
        await channel.rpc(framing.build(commands.Basic.Qos, prefetch_count=1))
        await consume(channel, stream, tag, spec)
        if not arrived.is_set():
            try:
                await asyncio.wait_for(arrived.wait(), GRACE)
            except asyncio.TimeoutError:
                pass  # an empty stream, or one that has nothing at or after that moment
        await channel.rpc(framing.build(commands.Basic.Cancel, consumer_tag=tag))
    finally:
        await channel.close()
    if foreign:
        raise not_a_stream(stream)
    return pick(offsets) if offsets else None
