"""Consumer timeouts as RabbitMQ 4.3 applies them: to quorum queues only, one consumer at a time.

A delivery left unacknowledged longer than the consumer's timeout (its
``x-consumer-timeout`` argument, else the queue's, else the broker's
``consumer_timeout``) goes back to the queue: a return that RabbitMQ 4.3 counts
in ``x-acquired-count`` but not towards the delivery-limit. Its consumer gets
``basic.cancel`` and its channel stays open; acknowledging the timed-out tags
afterwards is accepted and does nothing. Classic queues and streams have no
consumer timeout on 4.3 (3.10 to 4.2 closed the channel with 406, on every
queue type: the fault injection ``close_channels`` stands in for that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .channel import Channel
    from .consumer import Consumer
    from .settle import Unacked

CHECK_INTERVAL = 0.1  # seconds; RabbitMQ sets a timer for the earliest deadline


def timeout_argument(arguments: dict[str, Any] | None) -> int | None:
    value = (arguments or {}).get("x-consumer-timeout")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def expire(channel: Channel, now: float, default_ms: int | None) -> None:
    """Time out the channel's quorum consumers whose oldest unacknowledged delivery is too old."""
    expired: dict[Consumer, list[Unacked]] = {}
    for entry in channel.unacked.values():
        consumer = entry.consumer
        if consumer is None or not entry.queue.is_quorum:
            continue
        limit_ms = consumer.timeout_ms or timeout_argument(entry.queue.arguments) or default_ms
        if limit_ms and entry.delivered_at < now - limit_ms / 1000.0:
            expired.setdefault(consumer, []).append(entry)
    for consumer, entries in expired.items():
        channel.time_out(consumer, entries)
