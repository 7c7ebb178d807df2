"""A channel's exchange and queue methods: declare, bind, unbind, purge, delete.

They only translate methods into calls on the vhost, which makes every check;
``Channel`` takes them in as a mixin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

if TYPE_CHECKING:
    from .connection import BrokerConnection
    from .queue import Queue
    from .vhost import VirtualHost

Q = commands.Queue
X = commands.Exchange


class DeclareMethods:
    connection: BrokerConnection
    vhost: VirtualHost
    number: int
    last_queue: str

    def _queue(self, name: str) -> Queue:
        return self.vhost.queue(name or self.last_queue, self.connection)

    def _reply(self, method: object) -> None:
        self.connection.send_method(self.number, method)

    def _on_exchange_declare(self, m: X.Declare) -> None:
        self.vhost.declare_exchange(
            m.exchange, m.exchange_type, bool(m.passive), bool(m.durable), bool(m.auto_delete), bool(m.internal), m.arguments or {}
        )
        if not m.nowait:
            self._reply(X.DeclareOk())

    def _on_exchange_delete(self, m: X.Delete) -> None:
        self.vhost.delete_exchange(m.exchange, bool(m.if_unused))
        if not m.nowait:
            self._reply(X.DeleteOk())

    def _on_exchange_bind(self, m: X.Bind) -> None:
        self.vhost.bind_exchange(m.destination, m.source, m.routing_key, m.arguments or {})
        if not m.nowait:
            self._reply(X.BindOk())

    def _on_exchange_unbind(self, m: X.Unbind) -> None:
        self.vhost.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments or {})
        if not m.nowait:
            self._reply(X.UnbindOk())

    def _on_queue_declare(self, m: Q.Declare) -> None:
        queue = self.vhost.declare_queue(
            m.queue, bool(m.passive), bool(m.durable), bool(m.exclusive), bool(m.auto_delete), m.arguments or {}, self.connection
        )
        self.last_queue = queue.name
        if not m.nowait:
            reply = Q.DeclareOk.__new__(Q.DeclareOk)
            reply.queue, reply.message_count, reply.consumer_count = queue.name, queue.message_count, queue.consumer_count
            self._reply(reply)

    def _on_queue_bind(self, m: Q.Bind) -> None:
        self.vhost.bind(m.queue or self.last_queue, m.exchange, m.routing_key, m.arguments or {}, self.connection)
        if not m.nowait:
            self._reply(Q.BindOk())

    def _on_queue_unbind(self, m: Q.Unbind) -> None:
        self.vhost.unbind(m.queue or self.last_queue, m.exchange, m.routing_key, m.arguments or {}, self.connection)
        self._reply(Q.UnbindOk())

    def _on_queue_purge(self, m: Q.Purge) -> None:
        count = self._queue(m.queue).purge()
        if not m.nowait:
            self._reply(Q.PurgeOk(message_count=count))

    def _on_queue_delete(self, m: Q.Delete) -> None:
        count = self.vhost.delete_queue(m.queue or self.last_queue, bool(m.if_unused), bool(m.if_empty), self.connection)
        if not m.nowait:
            self._reply(Q.DeleteOk(message_count=count))
