"""A super stream's partitions, found by name over AMQP 0-9-1.

AMQP 0-9-1 cannot list an exchange's bindings, but partitions created the usual
way (``rabbitmq-streams add_super_stream NAME --partitions N``, or a client's
super-stream creation) are the streams ``NAME-0`` ... ``NAME-(N-1)``. So the
partitions are the run of those names a passive ``queue.declare`` finds, up to
the first that is missing. Planning asks again before each batch: a partition
added later is read from its first message, and one that is gone is data loss
(the planner's dropped-stream check).
"""

from __future__ import annotations

from ..client import AmqpClient, stats_of
from ..errors import AmqpSourceError, NotFound

__all__ = ["MAX_PARTITIONS", "partitions_of"]

MAX_PARTITIONS = 10_000


async def partitions_of(client: AmqpClient, super_stream: str) -> tuple[str, ...]:
    found: list[str] = []
    while len(found) < MAX_PARTITIONS:
        name = f"{super_stream}-{len(found)}"
        channel = await client.channel()
        try:
            await stats_of(channel, name)
        except NotFound:
            break  # the 404 closed the channel
        await channel.close()
        found.append(name)
    if not found:
        raise AmqpSourceError(
            f"super stream '{super_stream}': no partition stream '{super_stream}-0' found. Declare the super stream "
            "(rabbitmq-streams add_super_stream), or give its partitions' names with option 'stream'"
        )
    return tuple(found)
