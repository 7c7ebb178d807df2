"""The consuming side of the client: deliveries sliced from their frames, and queue statistics.

A delivery's method frame is cut with ``struct`` rather than decoded by pamqp:
at tens of thousands of messages a second, decoding every frame into objects
was most of the source runner's CPU.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from pamqp import commands

from .. import framing

if TYPE_CHECKING:
    from .channel import ClientChannel
    from .connection import AmqpClient

__all__ = ["DELIVER", "QueueStats", "body_size", "parse_deliver", "queue_depths", "queue_stats", "stats_of", "whole_delivery"]

DELIVER = struct.pack(">HH", 60, 60)
_U64 = struct.Struct(">Q")
_FRAME_HEAD = framing.FRAME_HEAD.unpack_from
_BODY_SIZE = struct.Struct(">Q").unpack_from


def parse_deliver(payload: bytes, start: int = 0) -> tuple[int, bool, str, str]:
    """basic.deliver at ``start``: (delivery tag, redelivered, exchange, routing key); the consumer tag is skipped."""
    offset = start + 4 + 1 + payload[start + 4]
    tag = _U64.unpack_from(payload, offset)[0]
    redelivered = bool(payload[offset + 8] & 1)
    offset += 9
    xlen = payload[offset]
    exchange = payload[offset + 1 : offset + 1 + xlen].decode("utf-8", "replace")
    offset += 1 + xlen
    rlen = payload[offset]
    routing_key = payload[offset + 1 : offset + 1 + rlen].decode("utf-8", "replace")
    return tag, redelivered, exchange, routing_key


def body_size(header: bytes) -> int:
    return int(_U64.unpack_from(header, 4)[0])


def whole_delivery(data: bytes, start: int, end: int, channel: ClientChannel | None) -> int:
    """Hand over the delivery whose method payload is ``data[start:end]`` if its header and (single)
    body frame follow it in ``data``: the offset after them, or 0 to take the frames one by one."""
    if channel is None or not channel.idle:
        return 0
    number = channel.number
    available = len(data)
    at = end + 1  # the content header frame
    if available - at < 8:
        return 0
    ftype, ch, size = _FRAME_HEAD(data, at)
    header_end: int = at + 7 + size
    if ftype != 2 or ch != number or size < 14 or header_end >= available:
        return 0
    header = data[at + 7 : header_end]
    expected: int = _BODY_SIZE(header, 4)[0]
    if expected == 0:
        channel.deliver(parse_deliver(data, start), header, b"")
        return header_end + 1
    at = header_end + 1  # the body frame
    if available - at < 8:
        return 0
    ftype, ch, size = _FRAME_HEAD(data, at)
    body_end: int = at + 7 + size
    if ftype != 3 or ch != number or size != expected or body_end >= available:
        return 0
    channel.deliver(parse_deliver(data, start), header, data[at + 7 : body_end])
    return body_end + 1


class QueueStats(NamedTuple):
    ready: int  # messages waiting in the queue
    consumers: int  # RabbitMQ counts no stream consumers here


async def stats_of(channel: ClientChannel, queue: str) -> QueueStats:
    """A passive ``queue.declare`` (a missing queue raises ``NotFound``, which closes ``channel``)."""
    ok = await channel.rpc(framing.build(commands.Queue.Declare, queue=queue, passive=True))
    return QueueStats(int(ok.message_count or 0), int(ok.consumer_count or 0))


async def queue_stats(client: AmqpClient, queues: list[str] | tuple[str, ...]) -> dict[str, QueueStats]:
    """Per queue, from passive declares, each on a channel of its own."""
    stats = {}
    for queue in queues:
        channel = await client.channel()
        stats[queue] = await stats_of(channel, queue)
        await channel.close()
    return stats


async def queue_depths(client: AmqpClient, queues: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Ready messages per queue."""
    return {q: s.ready for q, s in (await queue_stats(client, queues)).items()}
