"""The broker's model: exchanges, queues and bindings of the single vhost '/'.

Every check that RabbitMQ makes on declare/bind/delete lives here, with its
reply code and text, so channels only translate methods into calls.
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any, cast

from spark_amqp import errors
from spark_amqp.rabbitmq import EXCHANGE_TYPES

from .exchange import Exchange
from .message import Message, dead_letter
from .queue import Queue
from .stream import StreamQueue, is_stream

SYSTEM_EXCHANGES = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
    "amq.rabbitmq.trace": "topic",
}


# RabbitMQ 4.3's refusal when deprecated_features.permit.transient_nonexcl_queues = false (cut at 255 bytes).
DENIED_TRANSIENT = (
    "INTERNAL_ERROR - Feature `transient_nonexcl_queues` is deprecated.\n"
    "Its use is not permitted per the configuration (overriding the default, which is permitted):\n"
    '    "deprecated_features.permit.transient_nonexcl_queues = false"\n'
    "Its use will not be permit..."
)


class VirtualHost:
    def __init__(self, name: str = "/", denied: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.denied = denied  # deprecated features the operator denies, as RabbitMQ 4.x names them
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        for xname, kind in SYSTEM_EXCHANGES.items():
            self.exchanges[xname] = Exchange(xname, kind, durable=True, internal=xname == "amq.rabbitmq.trace")

    # -- exchanges -------------------------------------------------------

    def declare_exchange(
        self, name: str, kind: str, passive: bool, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any]
    ) -> None:
        if name == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        if passive:
            self.exchange(name)
            return
        if name.startswith("amq."):
            raise errors.AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if kind not in EXCHANGE_TYPES:
            # RabbitMQ 4.x closes the channel (406); 3.10 closed the connection (503).
            raise errors.PreconditionFailed(f"unknown exchange type '{kind}'")
        existing = self.exchanges.get(name)
        if existing is not None:
            field = existing.equivalent(kind, durable, auto_delete, internal, arguments)
            if field is not None:
                current = getattr(existing, "kind" if field == "type" else field)
                received = {"type": kind, "durable": durable, "auto_delete": auto_delete, "internal": internal}[field]
                raise errors.PreconditionFailed(
                    f"inequivalent arg '{field}' for exchange '{name}' in vhost '{self.name}': "
                    f"received {_fmt(received)} but current is {_fmt(current)}"
                )
            return
        self.exchanges[name] = Exchange(name, kind, durable, auto_delete, internal, arguments)

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        if name == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        if name in SYSTEM_EXCHANGES:
            raise errors.AccessRefused(f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # RabbitMQ 3.10 treats deleting a missing exchange as success
        if if_unused and exchange.bindings:
            raise errors.PreconditionFailed(f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]
        for source in list(self.exchanges.values()):
            if source.to_exchanges:
                source.unbind_queue(exchange)
                self._auto_delete_exchange(source)

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise errors.NotFound(f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    # -- queues ----------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        owner: object,
    ) -> Queue:
        if passive:
            return self.queue(name, owner)
        stream = is_stream(arguments)
        if name == "" and stream:
            raise errors.PreconditionFailed("Cannot declare a server-named queue for type rabbit_stream_queue")
        if name == "":
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        elif name.startswith("amq."):
            raise errors.AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        if exclusive:
            durable = False  # RabbitMQ declares an exclusive queue transient whatever durable says
        existing = self.queues.get(name)
        if existing is not None:
            # Strict: a declare must say exclusive exactly when the queue is, and come from its owner.
            if existing.exclusive_owner is not (owner if exclusive else None):
                raise self._locked(existing)
            mismatch = existing.equivalent(durable, exclusive, auto_delete, arguments)
            if mismatch is not None:
                raise errors.PreconditionFailed(mismatch)
            return existing
        if not durable and not exclusive and not stream and "transient_nonexcl_queues" in self.denied:
            raise errors.reply_error(541, DENIED_TRANSIENT, 50, 10, on_connection=True)
        if stream:
            # A StreamQueue answers every call the vhost, exchanges and channels make on a Queue.
            queue = cast(Queue, StreamQueue(name, durable, exclusive, auto_delete, arguments))
        else:
            queue = Queue(name, durable, owner if exclusive else None, auto_delete, arguments, self.dead_letter)
        self.queues[name] = queue
        return queue

    def queue(self, name: str, owner: object) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise errors.NotFound(f"no queue '{name}' in vhost '{self.name}'")
        self._check_owner(queue, owner)
        return queue

    def _check_owner(self, queue: Queue, owner: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            raise self._locked(queue)

    def _locked(self, queue: Queue) -> errors.ResourceLocked:
        return errors.ResourceLocked(
            f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost '{self.name}'. "
            "It could be originally declared on another connection or the exclusive property value "
            "does not match that of the original declaration."
        )

    def bind(self, queue_name: str, exchange_name: str, routing_key: str, arguments: dict[str, Any], owner: object) -> None:
        if exchange_name == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        queue = self.queue(queue_name, owner)
        self.exchange(exchange_name).bind(queue, routing_key, arguments)

    def bind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]) -> None:
        if destination == "" or source == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        target = self.exchange(destination)
        self.exchange(source).bind(target, routing_key, arguments)

    def unbind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]) -> None:
        if destination == "" or source == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        target, origin = self.exchanges.get(destination), self.exchanges.get(source)
        if target is None or origin is None:
            return  # as for queues, unbinding what is not there succeeds
        origin.unbind(target, routing_key, arguments)
        self._auto_delete_exchange(origin)

    def unbind(self, queue_name: str, exchange_name: str, routing_key: str, arguments: dict[str, Any], owner: object) -> None:
        if exchange_name == "":
            raise errors.AccessRefused("operation not permitted on the default exchange")
        queue = self.queues.get(queue_name)
        exchange = self.exchanges.get(exchange_name)
        if queue is None or exchange is None:
            return  # unbinding something that is not there succeeds in 3.10
        # A binding that is not there is no use of the queue: unbinding it succeeds even on another
        # connection's exclusive queue.
        if not any(b.same_as(queue, routing_key, arguments) for b in exchange.bindings):
            return
        self._check_owner(queue, owner)
        exchange.unbind(queue, routing_key, arguments)
        self._auto_delete_exchange(exchange)

    def delete_queue(self, name: str, if_unused: bool, if_empty: bool, owner: object) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self._check_owner(queue, owner)
        if if_unused and queue.consumer_count:  # stream consumers do not count, as on RabbitMQ 3.10
            raise errors.PreconditionFailed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.ready:
            raise errors.PreconditionFailed(f"queue '{name}' in vhost '{self.name}' not empty")
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        if self.queues.get(queue.name) is queue:
            del self.queues[queue.name]
        for exchange in list(self.exchanges.values()):
            exchange.unbind_queue(queue)
            self._auto_delete_exchange(exchange)
        return queue.delete()

    def _auto_delete_exchange(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.bindings and self.exchanges.get(exchange.name) is exchange:
            del self.exchanges[exchange.name]

    def connection_closed(self, owner: object) -> None:
        for queue in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self.remove_queue(queue)

    def consumer_gone(self, queue: Queue) -> None:
        if queue.auto_delete and queue.had_consumer and not queue.consumers and not queue.deleted:
            self.remove_queue(queue)

    # -- routing -----------------------------------------------------------

    def route(self, exchange_name: str, message: Message) -> list[Queue]:
        if exchange_name == "":
            queue = self.queues.get(message.routing_key)
            return [queue] if queue is not None else []
        exchange = self.exchange(exchange_name)
        if exchange.internal:
            raise errors.AccessRefused(f"cannot publish to internal exchange '{exchange_name}' in vhost '{self.name}'")
        return self._through(exchange, message)

    @staticmethod
    def _through(exchange: Exchange, message: Message) -> list[Queue]:
        """The queues ``exchange`` routes to, following exchange-to-exchange bindings (each exchange once)."""
        if not exchange.to_exchanges:
            return exchange.route(message)  # type: ignore[return-value]
        queues: dict[Any, None] = {}
        seen = {exchange}
        pending = [exchange]
        while pending:
            for destination in pending.pop().route(message):
                if isinstance(destination, Exchange):
                    if destination not in seen:
                        seen.add(destination)
                        pending.append(destination)
                else:
                    queues[destination] = None
        return list(queues)

    def dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        dlx = queue.args.dead_letter_exchange
        if dlx is None:
            return
        exchange = self.exchanges.get(dlx) if dlx else None
        if dlx and exchange is None:
            return  # RabbitMQ drops the message when the DLX does not exist
        routing_key = queue.args.dead_letter_routing_key or message.routing_key
        dead = dead_letter(message, queue.name, reason, dlx, routing_key)
        # Route with the original message's exchange/key recorded in x-death.
        targets = self.route(dlx, dead) if exchange is None or not exchange.internal else self._through(exchange, dead)
        loop_time = asyncio.get_running_loop().time()
        for target in targets:
            if target is queue and reason == "expired":
                continue  # a message that would expire back into its own queue forever is dropped
            target.publish(dead.copy_for_queue() if len(targets) > 1 else dead, loop_time)

    # -- introspection (tests, the CLI) ----------------------------------

    def stats(self, name: str) -> dict[str, int]:
        queue = self.queues.get(name)
        if queue is None:
            raise KeyError(name)
        return {"ready": queue.message_count, "unacked": queue.unacked, "consumers": len(queue.consumers)}  # every consumer, streams too


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return f"'{'true' if value else 'false'}'"
    return f"'{value}'"
