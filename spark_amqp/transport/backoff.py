"""``Backoff``: the delay before each retry of a transient fault, doubling from 0.2 s up to a cap.

Every retry loop in the connector (the source's consumer, the stream planner and range
readers, the blocking client) takes its delays from here, so they back off alike.
"""

from __future__ import annotations

__all__ = ["Backoff"]

FIRST = 0.2


class Backoff:
    def __init__(self, cap: float = 10.0) -> None:
        self.cap = cap
        self.delay = FIRST
        self.failures = 0  # since the last success

    def next(self) -> float:
        """The delay to wait now; the following one is twice as long (up to ``cap``)."""
        delay = self.delay
        self.delay = min(self.cap, self.delay * 2)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.delay = FIRST
        self.failures = 0
