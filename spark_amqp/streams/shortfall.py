"""``Shortfall``: a stream that ends before the offset a query has read it up to.

Two causes look alike when they begin. A member still catching up: a replica deleted and added
back starts empty and copies the leader's log, and a restarted node replays its own; whoever asks
that member where the stream ends hears an offset from the past. A stream deleted and declared
again: its offsets start over at 0. The first passes as the member catches up; the second lasts.
So a shortfall is waited out as an outage is, for up to ``brokerOutageTimeout``, and only then
fails the query. A new stream that grows past the position in the meantime is told apart sooner,
by the message before the position (``identity``). Seen in CI: a query failed when its planner
asked the replica just added back to a 3-node cluster (nothing was lost, but the query stopped).
Pure: the caller passes the clock.
"""

from __future__ import annotations

import logging
import time

from ..errors import AmqpSourceError

__all__ = ["Shortfall"]

log = logging.getLogger("spark_amqp.streams")


class Shortfall:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # stream -> (the position it fell short of, when first seen so: monotonic). Keyed by position too: a range
        # reader that read on since its last shortfall (it asks only when silent) starts a new wait, not the old one's.
        self._since: dict[str, tuple[int, float]] = {}

    def short(self, stream: str, end: int, position: int, said: str, now: float | None = None) -> bool:
        """Whether ``stream``, which the broker says ends at ``end``, falls short of ``position`` (then the caller
        reads none of it for now). ``said`` opens the error raised once it has for ``timeout`` seconds."""
        now = time.monotonic() if now is None else now
        if end >= position:
            if self._since.pop(stream, None) is not None:
                log.warning("AMQP source: stream '%s' reaches offset %d again: a member had not caught up", stream, position)
            return False
        known = self._since.get(stream)
        if known is None or known[0] != position:
            self._since[stream] = (position, now)
            log.warning(
                "AMQP source: %s: a member still catching up (after a restart, or a replica added back), or the stream "
                "deleted and declared again; waiting up to brokerOutageTimeout=%gs for it to reach that offset",
                said,
                self.timeout,
            )
            return True
        waited = now - known[1]
        if waited >= self.timeout:
            raise AmqpSourceError(
                f"{said}, still after {waited:.0f}s (brokerOutageTimeout={self.timeout:g}s): the stream was deleted and "
                "declared again (a member catching up, after a restart or a replica added back, would have caught up by "
                "now). Start the query with a new checkpointLocation, or raise brokerOutageTimeout to wait longer"
            )
        return True
