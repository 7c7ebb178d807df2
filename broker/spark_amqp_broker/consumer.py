"""A basic.consume subscription: which channel gets a queue's messages, and how many at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_amqp import framing

if TYPE_CHECKING:
    from .channel import Channel
    from .message import Message
    from .queue import Queue
    from .stream_filter import ConsumerFilter


class Consumer:
    __slots__ = (
        "channel",
        "exclusive",
        "no_ack",
        "position",
        "prefetch",
        "queue",
        "stream_filter",
        "tag",
        "tag_wire",
        "timeout_ms",
        "unacked",
    )

    def __init__(
        self, tag: str, channel: Channel, queue: Queue, no_ack: bool, exclusive: bool, prefetch: int, timeout_ms: int | None = None
    ) -> None:
        self.tag = tag
        self.tag_wire = framing.shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # 0 = unlimited
        self.unacked = 0
        self.position = 0  # next stream offset to read; unused on other queues
        self.timeout_ms = timeout_ms  # its x-consumer-timeout argument (quorum queues)
        self.stream_filter: ConsumerFilter | None = None  # its x-stream-filter (streams)

    raw_records = False  # whether a stream gives it its records as stored (deliver_record), not as AMQP 0-9-1

    def can_take(self) -> bool:
        channel = self.channel
        if not channel.open or channel.connection.write_paused:
            return False
        if self.no_ack:
            return True
        return not (self.prefetch and self.unacked >= self.prefetch)

    def deliver(self, queue: Queue, message: Message) -> None:
        self.channel.deliver(self, queue, message)

    def deliver_record(self, queue: Queue, record: object, offset: int) -> None:
        raise NotImplementedError  # only consumers with raw_records take records

    def cancelled_by_server(self) -> None:
        self.channel.consumer_cancelled_by_server(self)
