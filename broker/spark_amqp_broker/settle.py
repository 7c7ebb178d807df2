"""Settling deliveries on a channel: ack, nack, reject, recover, and requeueing on close.

Delivery tags are per channel; an unknown tag is a 406 channel close. On a stream
an ack only gives the consumer credit back, and so do nack, reject and recover on
RabbitMQ 4.x (3.10 closed the connection: 540 for nack and reject, 541 for recover).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

from pamqp import commands

from spark_amqp import errors

from . import timeouts

if TYPE_CHECKING:
    from .connection import BrokerConnection
    from .consumer import Consumer
    from .message import Message
    from .queue import Queue
    from .tx import Transaction

B = commands.Basic

# How a delivery is settled. RabbitMQ 4.3 counts a return towards a quorum queue's
# delivery-limit (x-delivery-count) when the consumer rejected it or its channel closed,
# but not for a nack or recover (they count only in x-acquired-count); 4.0 counted all.
ACK = "ack"
REQUEUE = "requeue"  # basic.nack(requeue) / basic.recover: not counted
RETURN = "return"  # basic.reject(requeue), a closed channel or connection: counted
DISCARD = "discard"  # nack or reject without requeue: dead-lettered if the queue says so
REJECT = "reject"  # a discard that is a failed delivery (basic.reject, AMQP 1.0's rejected): its copy counts it


class Unacked(NamedTuple):
    queue: Queue
    message: Message
    consumer: Consumer | None
    delivered_at: float
    tag: int


class SettleMethods:
    """Mixed into ``Channel``."""

    connection: BrokerConnection
    number: int
    unacked: OrderedDict[int, Unacked]
    timed_out: set[int]
    consumers: dict[str, Consumer]
    tx: Transaction | None

    def _take(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.values())
                unacked.clear()
                self.timed_out.clear()
                return taken
            if tag not in unacked and tag not in self.timed_out:
                raise errors.PreconditionFailed(f"unknown delivery tag {tag}")
            self.timed_out = {t for t in self.timed_out if t > tag}
            taken = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                taken.append(unacked.popitem(last=False)[1])
            return taken
        entry = unacked.pop(tag, None)
        if entry is None:
            if tag in self.timed_out:  # RabbitMQ 4.3 accepts it and ignores it
                self.timed_out.discard(tag)
                return []
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}")
        return [entry]

    def _release(self, entries: list[Unacked]) -> set[Queue]:
        touched: set[Queue] = set()
        for entry in entries:
            entry.queue.unacked -= 1
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked -= 1
            touched.add(entry.queue)
        return touched

    def settle(self, entries: list[Unacked], how: str) -> None:
        """``how``: ACK, REQUEUE, RETURN or DISCARD."""
        touched = self._release(entries)
        if how in (REQUEUE, RETURN):
            by_queue: dict[Queue, list[Message]] = {}
            for entry in entries:
                by_queue.setdefault(entry.queue, []).append(entry.message)
            for queue, messages in by_queue.items():
                queue.requeue(messages, counted=how == RETURN)
        elif how in (DISCARD, REJECT):
            for entry in entries:
                entry.message.delivery_count += how == REJECT  # the message is gone: only its dead copy tells
                entry.queue.reject(entry.message)
        for queue in touched:
            queue.dispatch()

    def _settle_or_hold(self, entries: list[Unacked], how: str) -> None:
        if self.tx is not None:
            self.tx.settles.append((entries, how))
        else:
            self.settle(entries, how)

    def _on_ack(self, method: B.Ack) -> None:
        if self.connection.server.faults.take("time_out_at_ack"):
            timeouts.expire(self, math.inf, 1)  # type: ignore[arg-type]
        self._settle_or_hold(self._take(method.delivery_tag, bool(method.multiple)), ACK)

    def _on_nack(self, method: B.Nack) -> None:
        self._settle_or_hold(self._take(method.delivery_tag, bool(method.multiple)), REQUEUE if method.requeue else DISCARD)

    def _on_reject(self, method: B.Reject) -> None:
        self._settle_or_hold(self._take(method.delivery_tag or 0, False), RETURN if method.requeue else REJECT)

    def _on_recover(self, method: B.Recover) -> None:
        if not method.requeue:
            raise errors.NotImplemented_("requeue=false")
        self.settle(self._take(0, True), REQUEUE)
        if isinstance(method, B.Recover):
            self.connection.send_method(self.number, B.RecoverOk())
