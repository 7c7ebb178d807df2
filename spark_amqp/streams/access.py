"""``BrokerAccess``: the questions stream mode asks the broker, over AMQP 0-9-1 or over the stream protocol.

The planner, the batch reader and the identity checks ask the same things either
way (where a stream ends and begins, which offset a moment is, the message at an
offset, a super stream's partitions); the uri's scheme picks how. The answers
are the same offsets, so a checkpoint written over one protocol is read over the
other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..client import AmqpClient
from ..client.super_streams import partitions_of
from ..stream_protocol.client import StreamClient
from ..transport.options import ConnectionOptions
from . import filtering, probe, protocol_probe
from .protocol_tails import ProtocolTailWatch
from .tails import TailWatch

__all__ = ["AMQP", "STREAM_PROTOCOL", "BrokerAccess", "Watch", "access_for"]

Watch = TailWatch | ProtocolTailWatch


@dataclass(frozen=True)
class BrokerAccess:
    name: str
    connect: Callable[[ConnectionOptions, str], Awaitable[Any]]
    tail: Callable[[Any, str], Awaitable[tuple[int, bytes] | None]]  # the last message's offset and body
    head: Callable[[Any, str], Awaitable[int | None]]  # the first offset
    message_at: Callable[[Any, str, int], Awaitable[tuple[int, bytes] | None]]  # at or after an offset
    filter_value_at: Callable[[Any, str, int], Awaitable[tuple[int, str | None] | None]]  # at or after an offset
    offset_at: Callable[[Any, str, int], Awaitable[int | None]]  # the first chunk at or after a moment (ms)
    partitions_of: Callable[[Any, str], Awaitable[tuple[str, ...]]]  # a super stream's
    tail_watch: Callable[[], Watch]
    require: Callable[[Any, Any], Awaitable[None]] = filtering.require  # refuse what the broker cannot serve


AMQP = BrokerAccess(
    "AMQP 0-9-1",
    AmqpClient.connect,
    probe.tail,
    probe.head,
    probe.message_at,
    probe.filter_value_at,
    probe.offset_at,
    partitions_of,
    TailWatch,
)
STREAM_PROTOCOL = BrokerAccess(
    "the stream protocol",
    StreamClient.connect,
    protocol_probe.tail,
    protocol_probe.head,
    protocol_probe.message_at,
    protocol_probe.filter_value_at,
    protocol_probe.offset_at,
    protocol_probe.partitions_of,
    ProtocolTailWatch,
)


def access_for(connection: ConnectionOptions) -> BrokerAccess:
    return STREAM_PROTOCOL if connection.stream_protocol else AMQP
