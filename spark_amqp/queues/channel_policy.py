"""``ChannelPolicy``: what a consumer channel closed by the broker, or a queue found shared, means for the query.

Reopen it (transient: RabbitMQ's consumer_timeout, a reply code
``errors.is_transient`` calls transient, another consumer just after our own
reconnect) or fail the query with a message that says why and how to fix it.
Pure apart from the clock and the log, so it is tested on its own.
"""

from __future__ import annotations

import logging
import time

from ..errors import AccessRefused, AmqpProtocolError, AmqpReplyError, OtherConsumers, ResourceLocked, explain
from .options import SourceOptions

log = logging.getLogger("spark_amqp.queues")


class ChannelPolicy:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._subscribed_once: set[str] = set()
        self._exclusive_refused_since: dict[str, float] = {}
        self._shared: dict[str, int] = {}  # queue -> consumers last counted, when more than ours

    def counted(self, queue: str, consumers: int) -> None:
        """A depth check counted ``consumers`` on ``queue``: more than ours is worth a warning (once per count)
        where the query must be the queue's only consumer."""
        shared = consumers if consumers > 1 and self.options.exclusive_consumer else 0
        if shared and self._shared.get(queue) != shared:
            log.warning(
                "AMQP source: queue '%s' has %d consumers; this query holds it, the newcomer should fail (an exactly-"
                "once query checks when it subscribes). Until it does, it takes messages from this query.",
                queue,
                shared,
            )
        self._shared[queue] = shared

    def subscribed(self, queue: str) -> None:
        self._subscribed_once.add(queue)
        self._exclusive_refused_since.pop(queue, None)

    def failure(self, queue: str, reason: AmqpProtocolError) -> str | None:
        """Why the query must fail, or None when the channel is to be reopened (logged here)."""
        c = self.options.connection
        if self._exclusive_conflict(reason):
            if self._exclusive_conflict_is_transient(queue):
                return None
            if isinstance(reason, OtherConsumers):
                found = (
                    f"queue '{queue}' on {c.display_uri} has another consumer: {reason.consumers} consumers counted after this "
                    "query subscribed (quorum queues accept a second consumer however exclusive the first)"
                )
            else:
                found = f"queue '{queue}' on {c.display_uri} already has an exclusive consumer ({reason})"
            return (
                f"{found}. Exactly-once (journalLocation) needs one streaming query per queue: stop the other consumer "
                f"(rabbitmqctl list_consumers -p {c.vhost} shows it; this connector's consumer tags start with "
                "'spark-amqp-' and name the host and the query run), or set exclusiveConsumer=false if you accept duplicates"
            )
        if not isinstance(reason, AmqpReplyError):
            return explain(reason, c.display_uri, c.username, c.vhost, f"queue '{queue}'")
        if not reason.transient:
            return explain(reason, c.display_uri, c.username, c.vhost, f"queue '{queue}'")
        if reason.code == 406 and reason.class_id == 0:  # a close no method caused: RabbitMQ's consumer_timeout
            log.warning(
                "AMQP source: RabbitMQ's consumer_timeout closed the channel of queue '%s' (%s). Deliveries stay "
                "unacknowledged until the batch holding them is committed; a trigger interval or batch duration "
                "longer than consumer_timeout causes this. Nothing is lost (they are redelivered and recognised), "
                "but raise consumer_timeout or shorten the trigger interval.",
                queue,
                reason.text,
            )
        else:
            log.warning("AMQP source: channel for queue '%s' closed (%s); reopening", queue, reason)
        return None

    def _exclusive_conflict(self, reason: AmqpProtocolError) -> bool:
        """Another consumer holds the queue: our exclusive basic.consume was refused, or we counted it."""
        if not self.options.exclusive_consumer:
            return False
        if isinstance(reason, OtherConsumers):
            return True
        # Worded from the reply: RabbitMQ says "in exclusive use"; a revoked read permission is a 403 too.
        return isinstance(reason, AccessRefused | ResourceLocked) and reason.method == "Basic.Consume" and "exclusive" in reason.text

    def _exclusive_conflict_is_transient(self, queue: str) -> bool:
        """After a reconnect, the broker may still hold our previous consumer until it notices the old connection is dead."""
        if queue not in self._subscribed_once:
            return False
        now = time.monotonic()
        since = self._exclusive_refused_since.setdefault(queue, now)
        grace = 2 * (self.options.connection.heartbeat or 60) + 5
        if now - since > grace:
            return False
        log.warning("AMQP source: queue '%s' still has another consumer (probably our previous connection); retrying", queue)
        return True
