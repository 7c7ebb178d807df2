"""A super stream's partitions, found by name over AMQP 0-9-1 (stream mode's planning and the sink both ask).

AMQP 0-9-1 cannot list an exchange's bindings, but partitions created the usual
way (``rabbitmq-streams add_super_stream NAME --partitions N``, or a client's
super-stream creation) are the streams ``NAME-0`` ... ``NAME-(N-1)``. So the
partitions are the run of those names a passive ``queue.declare`` finds, up to
the first that is missing. Planning asks again before each batch: a partition
added later is read from its first message, and one that is gone is data loss
(the planner's dropped-stream check).
"""

from __future__ import annotations

from ..errors import AmqpSourceError, NotFound
from ..rabbitmq import MAX_PARTITIONS, partition_name
from .connection import AmqpClient
from .consumer import stats_of

__all__ = ["partitions_of"]


async def partitions_of(client: AmqpClient, super_stream: str) -> tuple[str, ...]:
    found: list[str] = []
    while len(found) < MAX_PARTITIONS:
        name = partition_name(super_stream, len(found))
        channel = await client.channel()
        try:
            await stats_of(channel, name)
        except NotFound:
            break  # the 404 closed the channel
        await channel.close()
        found.append(name)
    if not found:
        raise AmqpSourceError(
            f"super stream '{super_stream}': no partition stream '{partition_name(super_stream, 0)}' found. Declare the "
            "super stream (rabbitmq-streams add_super_stream), or give its partitions' names with option 'stream'"
        )
    return tuple(found)
