"""The consuming side of the client: deliveries sliced from their frames, and queue depths.

A delivery's method frame is cut with ``struct`` rather than decoded by pamqp:
at tens of thousands of messages a second, decoding every frame into objects
was most of the source runner's CPU.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pamqp import commands

from .. import framing

if TYPE_CHECKING:
    from .connection import AmqpClient

__all__ = ["DELIVER", "body_size", "parse_deliver", "queue_depths"]

DELIVER = struct.pack(">HH", 60, 60)
_U64 = struct.Struct(">Q")


def parse_deliver(payload: bytes) -> tuple[int, bool, str, str]:
    """basic.deliver: (delivery tag, redelivered, exchange, routing key); the consumer tag is skipped."""
    offset = 4 + 1 + payload[4]
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


async def queue_depths(client: AmqpClient, queues: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Ready messages per queue, from passive declares (a missing queue raises ``NotFound``)."""
    depths = {}
    for queue in queues:
        channel = await client.channel()
        ok = await channel.rpc(framing.build(commands.Queue.Declare, queue=queue, passive=True))
        depths[queue] = int(ok.message_count or 0)
        await channel.close()
    return depths
