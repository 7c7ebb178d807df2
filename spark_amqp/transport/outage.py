"""``Outage``: since when a running query has not reached its broker, what each endpoint last said, and when
waiting becomes a failure.

Once a query has reached its broker, a lost broker is waited out with backoff (a restart, a failover, a
rolling upgrade only delay it). Without a deadline a broker gone for good looks like an idle queue: no new
batch, no error, warnings only in a log on the driver or an executor. So the query shows the outage in its
progress (``report``), and fails after ``brokerOutageTimeout`` (``check``), naming every endpoint and the
last thing each said. The deadline counts from the last answer the connection had from its broker, so a silent
network found late (by heartbeats, or a question's timeout) does not stretch it. Pure: the caller records failures
and successes and passes the clock.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

from ..errors import AllEndpointsFailed, AmqpSourceError, Unchecked
from .options import ConnectionOptions

__all__ = ["LAST_ATTEMPT", "BrokerOutage", "Outage", "retried_since"]

# The most a retried task's connection attempt takes once the query's deadline has passed (``Outage.attempt_options``).
LAST_ATTEMPT = 5.0


class BrokerOutage(AmqpSourceError):
    """No endpoint of the uri answered for ``brokerOutageTimeout``."""


class Outage:
    """``retried_since``: in a task that Spark runs again, when its work was planned (wall clock, the driver's). Spark
    retries a task up to ``spark.task.maxFailures`` (4) times, and each attempt's own deadline would make the query's
    wait four times ``brokerOutageTimeout``: an earlier attempt has waited since then, so a retried one that reaches
    no endpoint once that long has passed fails at once."""

    def __init__(self, timeout: float, where: str, retried_since: float | None = None) -> None:
        self.timeout = timeout
        self.where = where  # the uri as shown (no password)
        self.retried_since = retried_since
        self.since: float | None = None  # monotonic, when the first failure of this outage came
        self.since_wall: float | None = None
        self.last: dict[str, str] = {}  # endpoint (or the uri) -> its last error, in the order last tried
        self.last_error: BaseException | None = None
        self.failures = 0
        self.unreachable = False  # the last failure reached no endpoint (not a connection that ended)
        # In a task: since when the planner had heard nothing from the broker when it planned the task (wall clock, the
        # driver's), if it was in an outage: the query's last answer came then.
        self.quiet_since: float | None = None

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(
        self,
        err: BaseException,
        now: float | None = None,
        unreachable: bool = True,
        heard: float | None = None,
        tried: float | None = None,
    ) -> None:
        """``unreachable``: no endpoint gave a connection (False: one that was open ended). ``heard``: when the connection
        that ended last heard from its broker; ``tried``: with none open, when the failed attempt began (both monotonic).
        The outage began with the last answer the query had (this connection's, or the planner's: ``quiet_since``), not
        when the silence was found: with the default heartbeat (60 s) finding it takes up to two minutes, and a deadline
        counted from there doubled."""
        self.unreachable = unreachable
        now = time.monotonic() if now is None else now
        if self.since is None:
            answers = [t for t in (heard, self._quiet()) if t is not None]
            last = max(answers) if answers else tried
            began = now if last is None else min(now, last)
            self.since, self.since_wall = began, time.time() - (time.monotonic() - began)
        self.failures += 1
        self.last_error = err
        cause = err.__cause__ if err.__cause__ is not None else err
        if isinstance(cause, AllEndpointsFailed):
            self.last = dict(cause.failures)
        else:
            self.last = {self.where: str(err)}

    def _quiet(self) -> float | None:
        quiet = self.quiet_since
        return None if quiet is None else time.monotonic() - (time.time() - quiet)

    def recovered(self) -> None:
        self.since = self.since_wall = self.quiet_since = None
        self.unreachable = False
        self.last = {}
        self.last_error = None
        self.failures = 0

    def left(self, now: float | None = None) -> float:
        """Seconds until the outage has lasted ``timeout`` (a backoff waits no longer: the last attempt comes in time)."""
        return max(0.0, self.timeout - self.seconds(now))

    def seconds(self, now: float | None = None) -> float:
        since = self.since  # read once: the queue source's IO thread may record a recovery between two reads
        if since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    def allows(self, delay: float, now: float | None = None, wall: float | None = None) -> bool:
        """Whether one more attempt after ``delay`` still comes within the timeout (else give up now, not after)."""
        return self.seconds(now) + delay <= self.timeout and not self.retry_expired(delay, wall)

    def waited(self, now: float | None = None, wall: float | None = None) -> str:
        """How long the caller tried before it gave up, for its error."""
        tried = f"still, after {self.failures} attempt(s) over {self.seconds(now):.0f}s"
        if self.retried_since is not None and self.unreachable and self.seconds(now) < self.timeout:  # not its own wait
            return f"{tried}: {self.retried_too_late(wall)}"
        return f"{tried}: brokerOutageTimeout={self.timeout:g}s"

    def attempt_options(self, options: ConnectionOptions, now: float | None = None, wall: float | None = None) -> ConnectionOptions:
        """``options`` for the next connection attempt: one that ends by the query's deadline, or ``LAST_ATTEMPT`` after
        it once that has passed. An attempt waits ``connectionTimeout`` on a silent node, and each one begun just
        before the deadline, or in each of Spark's retries of a task after it, stretched the query's deadline by that
        much (by 60 s of the defaults' 30 s with three attempts, measured)."""
        limit = max(LAST_ATTEMPT, self.timeout - self.lasted(now, wall))
        if options.connection_timeout <= limit:
            return options
        return dataclasses.replace(options, connection_timeout=limit)

    def lasted(self, now: float | None = None, wall: float | None = None) -> float:
        """How long the query has gone without an answer, as far as this side knows: this outage, the planner's
        (``quiet_since``), or since a retried task's work was planned."""
        wall = time.time() if wall is None else wall
        known = [self.seconds(now)]
        if self.quiet_since is not None:
            known.append(wall - self.quiet_since)
        if self.retried_since is not None:
            known.append(self.planned_ago(wall))
        return max(known)

    def retry_expired(self, delay: float = 0.0, wall: float | None = None) -> bool:
        """In a retried task that reaches no endpoint, whether its work was planned ``timeout`` or more ago (after
        ``delay``): an earlier attempt has waited out the broker since then (see the class)."""
        if self.retried_since is None or self.since is None or not self.unreachable:
            return False
        return self.planned_ago(wall) + delay >= self.timeout

    def planned_ago(self, wall: float | None = None) -> float:
        assert self.retried_since is not None
        return (time.time() if wall is None else wall) - self.retried_since

    def retried_too_late(self, wall: float | None = None) -> str:
        """Why a retried task gives up at once (``retry_expired``), for its error."""
        return (
            f"this is Spark's retry of a task planned {self.planned_ago(wall):.0f}s ago, whose earlier attempt waited for the "
            f"broker (brokerOutageTimeout={self.timeout:g}s), so this one does not wait again"
        )

    def check(self, now: float | None = None, wall: float | None = None) -> None:
        """Raise ``BrokerOutage`` once the outage has lasted ``timeout`` seconds (in a retried task, see the class)."""
        if self.retry_expired(wall=wall):
            raise BrokerOutage(
                f"no answer from {self.where}: {self.retried_too_late(wall)}; the last error of each: {self.last_errors}. "
                "Check the broker and the network; the query can be restarted from its checkpoint once the broker answers "
                "(raise brokerOutageTimeout to wait longer)"
            )
        if self.since is not None and self.seconds(now) >= self.timeout:
            if isinstance(self.last_error, Unchecked):  # the broker answers: its message says what it could not ask
                raise AmqpSourceError(f"{self.last_error} ({self.waited(now, wall)})")
            raise BrokerOutage(
                f"no answer from {self.where} for {self.seconds(now):.0f}s (brokerOutageTimeout={self.timeout:g}s), "
                f"{self.failures} attempt(s); the last error of each: {self.last_errors}. Check the broker and the "
                "network; the query can be restarted from its checkpoint once the broker answers (raise "
                "brokerOutageTimeout to wait longer)"
            )

    @property
    def last_errors(self) -> str:
        return ", ".join(f"{where} ({error})" if where != self.where else error for where, error in self.last.items())

    def report(self, now: float | None = None) -> dict[str, Any] | None:
        """What the query's progress shows of the outage (None while the broker answers)."""
        since_wall = self.since_wall  # read once, as in ``seconds``
        if since_wall is None:
            return None
        since = datetime.datetime.fromtimestamp(since_wall, datetime.UTC).isoformat(timespec="seconds")
        return {"since": since, "seconds": round(self.seconds(now)), "attempts": self.failures, "lastError": self.last_errors}


def retried_since(planned_at: float) -> float | None:
    """``planned_at`` in Spark's retry of a task (``Outage``'s ``retried_since``); None in its first attempt, and outside
    a Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return planned_at if context is not None and context.attemptNumber() > 0 else None
