"""How much a micro-batch takes (``maxMessagesPerTrigger``, ``minMessagesPerTrigger``, ``maxTriggerDelay``),
parsed as both reading modes take it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AmqpOptionError
from ..option_reader import OptionReader

__all__ = ["TRIGGER_KEYS", "TriggerOptions", "parse_trigger"]

TRIGGER_KEYS = ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay")
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # Kafka's maxTriggerDelay default (15m)
# Queue mode holds a delayed batch's deliveries unacknowledged: keep well under
# RabbitMQ's consumer_timeout (30 min by default).
MAX_TRIGGER_DELAY = 3600.0


@dataclass(frozen=True)
class TriggerOptions:
    """How much a micro-batch takes: at most ``max_messages``; with ``min_messages``, a batch
    waits until that many are there or ``max_delay`` seconds passed since the last one."""

    max_messages: int | None  # None: everything available (stream mode's default)
    min_messages: int | None = None
    max_delay: float = DEFAULT_MAX_TRIGGER_DELAY


def parse_trigger(r: OptionReader, max_messages: int | None) -> TriggerOptions:
    minimum = r.integer("minMessagesPerTrigger", None, 1)
    if minimum is None:
        if r.text("maxTriggerDelay") is not None:
            raise AmqpOptionError("option 'maxTriggerDelay' only applies with option 'minMessagesPerTrigger'")
        return TriggerOptions(max_messages)
    if max_messages is not None and minimum > max_messages:
        raise AmqpOptionError(
            f"option 'minMessagesPerTrigger' ({minimum}) is larger than 'maxMessagesPerTrigger' ({max_messages}): "
            "a batch could never be both"
        )
    return TriggerOptions(max_messages, minimum, r.duration("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY, 0.001, MAX_TRIGGER_DELAY))
