"""``Admission``: how many messages the next micro-batch takes, in queue and stream mode alike.

Kafka's ``maxOffsetsPerTrigger`` / ``minOffsetsPerTrigger`` / ``maxTriggerDelay``
semantics: at most ``max`` messages; with a minimum, no batch until that many
are there or ``max_delay`` has passed since the last batch (the first batch of
a run goes at once). Sinks that pay seconds per commit (Delta) get fewer,
larger batches this way. Pure: the clock is passed in.
"""

from __future__ import annotations

from .trigger import TriggerOptions

__all__ = ["Admission"]


class Admission:
    def __init__(self, trigger: TriggerOptions) -> None:
        self.trigger = trigger
        self.last_batch_at: float | None = None

    def admit(self, available: int, now: float, max_rows: int | None, use_minimum: bool) -> int:
        """Messages to take now out of ``available``; 0 means wait.

        ``max_rows`` is Spark's ``ReadMaxRows`` (else the option); ``use_minimum``
        is false under AvailableNow, which must reach its end whatever the minimum.
        """
        if available <= 0:
            return 0
        cap = self.trigger.max_messages if max_rows is None else max_rows
        take = available if cap is None else min(available, cap)
        minimum = self.trigger.min_messages
        short = use_minimum and minimum is not None and available < minimum
        if short and self.last_batch_at is not None and now - self.last_batch_at < self.trigger.max_delay:
            return 0
        return take

    def fired(self, now: float) -> None:
        self.last_batch_at = now
