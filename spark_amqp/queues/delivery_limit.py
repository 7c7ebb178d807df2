"""``DeliveryLimitGuard``: a query without a journal stops before a quorum queue's delivery-limit drops a message.

RabbitMQ 4.x drops (or dead-letters) a quorum queue's message returned more
than its ``delivery-limit`` times, 20 by default, and stamps each return in the
message's ``x-delivery-count``. Without a journal the source holds a batch's
messages unacknowledged until Spark commits it, so every failure, restart or
lost connection of the query returns them once more: the guard warns from the
second return on and fails the query at ``maxDeliveryCount``, or, with ``onDeliveryLimit=deadLetter`` (over AMQP
1.0), dead-letters what reached it and reads on: the ``modified`` outcome with ``undeliverable-here`` makes RabbitMQ
dead-letter the message, and its ``x-opt-spark-amqp-reason`` annotation says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..errors import AmqpSourceError
from .intake import returns
from .ledger import Entry

log = logging.getLogger("spark_amqp.queues")

WARN_RETURNS = 2
DEFAULT_MAX_RETURNS_4X = 16  # four below RabbitMQ 4.x's default delivery-limit


def max_returns(configured: int | None, server_version: tuple[int, ...] | None) -> int:
    """maxDeliveryCount; by default 16 on RabbitMQ 4.x, off (0) on 3.x, which has no default delivery-limit."""
    if configured is not None:
        return configured
    return DEFAULT_MAX_RETURNS_4X if server_version is not None and server_version >= (4, 0) else 0


class DeliveryLimitGuard:
    def __init__(self) -> None:
        self.warned = 0  # the highest count already warned about: one warning per new high

    def check(self, entries: Iterable[Entry], limit: int) -> AmqpSourceError | None:
        """The error to fail the query with, or None (after a warning where one is due)."""
        worst = max(entries, key=lambda e: returns(e.delivery))
        count = returns(worst.delivery)
        queue = worst.delivery.queue
        if limit and count >= limit:
            return AmqpSourceError(
                f"queue '{queue}': a message came back {count} times (x-delivery-count {count}). RabbitMQ 4.x drops, "
                "or dead-letters, a quorum queue's message returned more than its delivery-limit (20 by default) times, and "
                "without journalLocation this query holds messages unacknowledged until Spark commits their batch, so every "
                "failure, restart or lost connection returns them once more. Stopped before the broker drops any: fix what "
                "makes the query restart, then set journalLocation (the journal keeps returned messages itself), or give the "
                "queue a dead-letter exchange or a higher delivery-limit (policy keys dead-letter-exchange, delivery-limit), "
                f"or raise maxDeliveryCount (now {limit}; 0 reads on regardless), or dead-letter such messages and read on "
                "(onDeliveryLimit=deadLetter, over AMQP 1.0)"
            )
        if count >= WARN_RETURNS and count > self.warned:
            self.warned = count
            log.warning(
                "AMQP source: queue '%s': a message came back %d times (x-delivery-count). RabbitMQ 4.x drops a quorum "
                "queue's message past its delivery-limit (20 by default); this query stops at %s. Set journalLocation, or a "
                "dead-letter exchange on the queue, so that restarts cannot lose messages.",
                queue,
                count,
                limit or "no limit (maxDeliveryCount=0)",
            )
        return None


def over_limit(entries: Iterable[Entry], limit: int) -> list[Entry]:
    return [e for e in entries if returns(e.delivery) >= limit]


def reason(entry: Entry, limit: int) -> str:
    """What the dead-lettered message carries as ``x-opt-spark-amqp-reason``."""
    return (
        f"returned {returns(entry.delivery)} times (x-delivery-count) to the spark-amqp query reading queue "
        f"'{entry.delivery.queue}', at or past its maxDeliveryCount {limit}: dead-lettered (onDeliveryLimit=deadLetter)"
    )
