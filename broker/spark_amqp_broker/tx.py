"""Channel transactions (tx.select / tx.commit / tx.rollback) as RabbitMQ 3.10 runs them.

A publish is routed when it arrives (a missing exchange fails at once) and
enqueued at commit, when unroutable mandatory messages are also returned. An
ack, nack or reject takes its delivery tags at once, so an unknown tag fails
then, and settles at commit; a rollback gives the tags back to the channel.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

from pamqp import commands

from spark_amqp import errors

if TYPE_CHECKING:
    from .channel import Channel
    from .connection import BrokerConnection
    from .message import Message
    from .queue import Queue
    from .settle import Unacked


class Publish(NamedTuple):
    queues: list[Queue]
    message: Message
    mandatory: bool


class Transaction:
    def __init__(self) -> None:
        self.publishes: list[Publish] = []
        self.settles: list[tuple[list[Unacked], str]] = []  # (entries, how: settle.ACK, ...)

    def commit(self, channel: Channel) -> None:
        publishes, settles = self.publishes, self.settles
        self.publishes, self.settles = [], []
        for publish in publishes:
            channel.enqueue([q for q in publish.queues if not q.deleted], publish.message, publish.mandatory, 0)
        for entries, how in settles:
            channel.settle(entries, how)

    def rollback(self, channel: Channel) -> None:
        settles = self.settles
        self.publishes, self.settles = [], []
        if not settles:
            return
        unacked: dict[int, Any] = dict(channel.unacked)
        for entries, _ in settles:
            for entry in entries:
                unacked[entry.tag] = entry
        channel.unacked = OrderedDict(sorted(unacked.items()))


T = commands.Tx


class TxMethods:
    """tx.select / commit / rollback; ``Channel`` takes them in as a mixin."""

    connection: BrokerConnection
    number: int
    confirming: bool
    tx: Transaction | None

    def _on_tx_select(self, method: T.Select) -> None:
        if self.confirming:
            raise errors.PreconditionFailed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self.connection.send_method(self.number, T.SelectOk())

    def _on_tx_commit(self, method: T.Commit) -> None:
        self._transaction().commit(self)  # type: ignore[arg-type]
        self.connection.send_method(self.number, T.CommitOk())

    def _on_tx_rollback(self, method: T.Rollback) -> None:
        self._transaction().rollback(self)  # type: ignore[arg-type]
        self.connection.send_method(self.number, T.RollbackOk())

    def _transaction(self) -> Transaction:
        if self.tx is None:
            raise errors.PreconditionFailed("channel is not transactional")
        return self.tx
