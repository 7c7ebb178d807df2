"""Consumers with a stream offset, which both modes need: stream mode reads streams with them, queue mode
refuses a stream with one (a consumer without ``x-stream-offset`` would start at the stream's end).

RabbitMQ refuses the ``x-stream-offset`` argument on classic and quorum queues (406), so a throwaway
consumer with it tells a stream from any other queue without reading anything.
"""

from __future__ import annotations

import itertools
from typing import Any

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel
from ..client.properties import LazyProperties
from ..errors import AmqpReplyError, AmqpSourceError, PreconditionFailed

__all__ = ["consume", "is_stream", "not_a_stream", "stream_offset"]

_tags = itertools.count(1)


def stream_offset(props: LazyProperties) -> int | None:
    """The delivery's stream offset, taken out of its headers (the ``offset`` column holds it)."""
    return props.pop_long_header("x-stream-offset")


def not_a_stream(stream: str, refusal: BaseException | None = None, why: str | None = None) -> AmqpSourceError:
    why = why or (f"the broker refused a stream offset for it: {refusal}" if refusal else "its deliveries carry no x-stream-offset header")
    return AmqpSourceError(
        f"queue '{stream}' is not a stream queue ({why}), so it was not read "
        "and nothing was acknowledged: read classic and quorum queues with option 'queue', or declare a stream with "
        "x-queue-type=stream"
    )


async def consume(
    channel: ClientChannel, stream: str, tag: str, offset: Any, prefetch: int, arguments: dict[str, Any] | None = None
) -> None:
    """basic.qos, then basic.consume from ``offset`` (with any other consumer ``arguments``): a stream refuses a
    consumer without a prefetch."""
    await channel.rpc(framing.build(commands.Basic.Qos, prefetch_count=prefetch))
    try:
        args = {"x-stream-offset": offset, **(arguments or {})}
        await channel.rpc(framing.build(commands.Basic.Consume, queue=stream, consumer_tag=tag, arguments=args))
    except PreconditionFailed as err:
        if "x-stream-offset" in err.text:  # RabbitMQ refuses the argument on other queue types
            raise not_a_stream(stream, err) from None
        raise


async def is_stream(client: AmqpClient, queue: str) -> bool:
    """Whether ``queue`` is a stream queue: only a stream takes ``x-stream-offset`` (on a throwaway channel,
    from ``next``, so nothing is delivered). Any other refusal says nothing about the type: False, and the
    caller's own calls meet it with its real cause."""
    channel = await client.channel()
    tag = f"spark-amqp-type-{next(_tags)}"
    try:
        await consume(channel, queue, tag, "next", 1)
    except AmqpSourceError:  # not_a_stream: the broker refused the argument
        return False
    except AmqpReplyError:  # 404, 403, 405: the caller's own declare or consume reports it
        return False
    finally:
        await channel.close()
    return True
