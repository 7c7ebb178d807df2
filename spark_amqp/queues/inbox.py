"""What the consumer's I/O thread hands the runner thread, in order, through ``ConsumerSession.inbox``."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["AckConfirmed", "Delivery", "SessionClosed"]


class Delivery(NamedTuple):
    """A message as the I/O thread hands it over, with the channel session it came on."""

    session: str
    queue: str
    tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: Any  # LazyProperties (or anything with pika's BasicProperties attribute names)
    body: bytes


class SessionClosed(NamedTuple):
    session: str
    queue: str
    reason: str


class AckConfirmed(NamedTuple):
    """The broker processed every round of acks up to ``round`` on ``session`` (a later sync reply proved it)."""

    session: str
    round: int
