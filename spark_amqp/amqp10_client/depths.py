"""How many messages queues hold, over AMQP 1.0: a receiver link without credit, and the ``available`` the
broker's answer to an echoed flow reports (RabbitMQ: the queue's ready messages)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import AmqpProtocolError
from .connection import Amqp10Client

__all__ = ["queue_depths"]


async def queue_depths(client: Amqp10Client, queues: Sequence[str]) -> dict[str, int]:
    depths: dict[str, int] = {}
    for queue in queues:
        receiver = await client.receiver(client.queue_address(queue), lambda delivery_id, message: None)
        try:
            available = await receiver.echo(credit=0)
        finally:
            await receiver.detach()
        if available is None:
            raise AmqpProtocolError(f"the broker did not say how many messages queue '{queue}' holds (no 'available' in its flow)")
        depths[queue] = available
    return depths
