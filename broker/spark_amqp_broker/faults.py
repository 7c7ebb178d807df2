"""Failures the embedded broker can be told to produce, for the connector's failure tests."""

from __future__ import annotations

from typing import Literal

# The faults that hit the next so many of something, then stop.
Countdown = Literal["nack_publishes", "replica_down", "leader_down", "time_out_at_ack"]


class Faults:
    """Mutable switches read by connections and channels on the broker's loop thread."""

    def __init__(self) -> None:
        self.nack_publishes = 0
        self.confirms_held = False
        self.refuse_until = 0.0
        self.stall_open = False  # log clients in but never answer connection.open
        self.alarm: str | None = None  # a memory or disk alarm: publishers blocked, their confirms held
        # The next so many basic.consume on a stream get RabbitMQ's 406 for a replica restarting after a failover.
        self.replica_down = 0
        # The next so many stream-protocol declare_publisher get 0x06, as while RabbitMQ elects a stream's new leader.
        self.leader_down = 0
        # The next so many basic.ack find their channel's quorum consumers just timed out (RabbitMQ 4.3's
        # timer fired before the ack was read): the deliveries are back in the queue, the ack is ignored.
        self.time_out_at_ack = 0

    def take(self, fault: Countdown) -> bool:
        """Whether this one is hit by ``fault``, one of those counting down (a count left, taken by one)."""
        left: int = getattr(self, fault)
        if left > 0:
            setattr(self, fault, left - 1)
            return True
        return False
