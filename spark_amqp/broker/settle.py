"""Settling deliveries on a channel: ack, nack, reject, recover, and requeueing on close.

Delivery tags are per channel; an unknown tag is a 406 channel close. On a stream,
nack and reject are refused (540) and an ack only gives the consumer credit back.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

from pamqp import commands

from .. import errors
from .stream import internal_error

if TYPE_CHECKING:
    from .connection import BrokerConnection
    from .consumer import Consumer
    from .message import Message
    from .queue import Queue
    from .tx import Transaction

B = commands.Basic


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
    consumers: dict[str, Consumer]
    global_prefetch: int
    global_unacked: int
    tx: Transaction | None

    def _take(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.values())
                unacked.clear()
                return taken
            if tag not in unacked:
                raise errors.PreconditionFailed(f"unknown delivery tag {tag}")
            taken = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                taken.append(unacked.popitem(last=False)[1])
            return taken
        entry = unacked.pop(tag, None)
        if entry is None:
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}")
        return [entry]

    def _release(self, entries: list[Unacked]) -> set[Queue]:
        touched: set[Queue] = set()
        for entry in entries:
            entry.queue.unacked -= 1
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
            touched.add(entry.queue)
        return touched

    def settle(self, entries: list[Unacked], requeue: bool | None) -> None:
        """requeue None = ack; True = back to the queue; False = reject (dead-letter)."""
        touched = self._release(entries)
        if requeue:
            by_queue: dict[Queue, list[Message]] = {}
            for entry in entries:
                by_queue.setdefault(entry.queue, []).append(entry.message)
            for queue, messages in by_queue.items():
                queue.requeue(messages)
        elif requeue is False:
            for entry in entries:
                entry.queue.reject(entry.message)
        if self.global_prefetch:
            touched.update(c.queue for c in self.consumers.values())
        for queue in touched:
            queue.dispatch()

    def _settle_or_hold(self, entries: list[Unacked], requeue: bool | None) -> None:
        if requeue is not None:
            for entry in entries:
                if entry.queue.is_stream:
                    raise entry.queue.refuse_settle()  # type: ignore[attr-defined]
        if self.tx is not None:
            self.tx.settles.append((entries, requeue))
        else:
            self.settle(entries, requeue)

    def _on_ack(self, method: B.Ack) -> None:
        entries = self._take(method.delivery_tag, bool(method.multiple))
        if self.tx is not None:
            self.tx.settles.append((entries, None))
        else:
            self.settle(entries, None)

    def _on_nack(self, method: B.Nack) -> None:
        self._settle_or_hold(self._take(method.delivery_tag, bool(method.multiple)), bool(method.requeue))

    def _on_reject(self, method: B.Reject) -> None:
        self._settle_or_hold(self._take(method.delivery_tag or 0, False), bool(method.requeue))

    def _on_recover(self, method: B.Recover) -> None:
        if not method.requeue:
            raise errors.NotImplemented_("requeue=false")
        if any(entry.queue.is_stream for entry in self.unacked.values()):
            raise internal_error()  # RabbitMQ 3.10 crashes on it: 541, connection closed
        self.settle(self._take(0, True), True)
        if isinstance(method, B.Recover):
            self.connection.send_method(self.number, B.RecoverOk())

    def oldest_unacked_at(self) -> float | None:
        if not self.unacked:
            return None
        return self.unacked[next(iter(self.unacked))].delivered_at
