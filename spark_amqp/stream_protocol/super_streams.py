"""A super stream's partitions by name over the stream protocol, where the broker cannot list them: RabbitMQ
3.10 never answers ``partitions`` for a super stream that does not exist, and the sink looks them up as the
AMQP 0-9-1 sink does. The partitions are the run of streams ``NAME-0``, ``NAME-1``... up to the first the
broker says does not exist; one that exists but has no running member (a leader election) is still one."""

from __future__ import annotations

from ..rabbitmq import MAX_PARTITIONS, partition_name
from .client import StreamClient

__all__ = ["STREAM_DOES_NOT_EXIST", "partitions_by_name"]

STREAM_DOES_NOT_EXIST = 0x02
# Names asked in one metadata request.
_BATCH = 100


async def partitions_by_name(client: StreamClient, super_stream: str) -> list[str]:
    found: list[str] = []
    while len(found) < MAX_PARTITIONS:
        names = [partition_name(super_stream, i) for i in range(len(found), len(found) + _BATCH)]
        answers = await client.metadata(*names)
        for name in names:
            if answers.get(name, (STREAM_DOES_NOT_EXIST, None))[0] == STREAM_DOES_NOT_EXIST:
                return found
            found.append(name)
    return found
