"""``Trigger.AvailableNow`` for queues: what a run reads, and when a queue has given it all.

The target is what each queue held when the run started (a passive declare; over AMQP 1.0, a link's ``available``)
plus what the source had already received. A queue whose messages run out
before its target (another consumer took some, a TTL expired them) is
finished once the broker reports it empty and nothing of it is buffered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from ..amqp10_client import Amqp10Client
from ..amqp10_client.depths import queue_depths as depths_over_amqp10
from ..client import AmqpClient, queue_depths
from ..errors import AmqpSourceError, explain, is_transient
from ..transport.options import ConnectionOptions

log = logging.getLogger("spark_amqp.queues")

IDLE_RECHECK_SECONDS = 0.5


def measure_depths(connection: ConnectionOptions, client_name: str, queues: Sequence[str]) -> dict[str, int]:
    """Ready messages per queue, on a connection of its own; transient failures are retried for up to connectionTimeout."""

    async def measure() -> dict[str, int]:
        if connection.amqp10:
            client10 = await Amqp10Client.connect(connection, client_name)
            try:
                return await depths_over_amqp10(client10, tuple(queues))
            finally:
                await client10.close()
        client = await AmqpClient.connect(connection, client_name)
        try:
            return await queue_depths(client, tuple(queues))
        finally:
            await client.close()

    deadline = time.monotonic() + connection.connection_timeout
    backoff = 0.2
    while True:
        try:
            return asyncio.run(measure())
        except Exception as err:
            if is_transient(err) and time.monotonic() + backoff < deadline:
                log.warning("AMQP source: cannot measure queue depths (%s); retrying", err)
                time.sleep(backoff)
                backoff = min(2 * backoff, 5.0)
                continue
            subject = f"queue '{queues[0]}'" if len(queues) == 1 else f"queues {', '.join(queues)}"
            raise AmqpSourceError(explain(err, connection.display_uri, connection.username, connection.vhost, subject)) from err


class AvailableNow:
    """Per queue, how many more messages this run takes."""

    def __init__(self, targets: dict[str, int], connection: ConnectionOptions, client_name: str) -> None:
        self.left = dict(targets)
        self.connection = connection
        self.client_name = client_name
        self._idle_since: float | None = None

    @property
    def reached(self) -> bool:
        return not any(self.left.values())

    @property
    def outstanding(self) -> int:
        """Messages this run has still to take, over every queue."""
        return sum(self.left.values())

    def take(self, queue: str) -> bool:
        """Whether one more message of ``queue`` belongs to this run (then it is counted)."""
        if self.left.get(queue, 0) > 0:
            self.left[queue] -= 1
            return True
        return False

    def give_back(self, queue: str) -> None:
        """A message counted by ``take`` is not in a batch after all."""
        self.left[queue] += 1

    def check_drained(self, settle: Callable[[list[str]], set[str] | None]) -> None:
        """Finish the queues the broker reports empty, at most every IDLE_RECHECK_SECONDS of idling.

        A queue reports nothing ready as soon as it has handed its last messages to this consumer, and they can
        still be on their way: a loaded CI machine ended a run 195 messages of 2,500 short. ``settle(queues)`` makes a
        round trip on each of their channels or links, whose answer comes behind every delivery the broker sent
        before it, and returns the queues of which something is buffered then; None if it could not (a channel
        went: what it held goes back to the queue, to be measured again)."""
        waiting = [q for q, n in self.left.items() if n > 0]
        if not waiting:
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
            return
        if now - self._idle_since < IDLE_RECHECK_SECONDS:
            return
        self._idle_since = now
        empty = [q for q, depth in measure_depths(self.connection, self.client_name, waiting).items() if depth == 0]
        if not empty:
            return
        buffered = settle(empty)
        if buffered is None:
            return
        for queue in empty:
            if queue not in buffered:
                log.info("AMQP source: queue '%s' drained before its AvailableNow target; finishing it", queue)
                self.left[queue] = 0
