"""A queue: ready messages in order, round-robin dispatch, TTL, length limits."""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from spark_amqp import errors

from .message import Message, with_return_counts

if TYPE_CHECKING:
    from .consumer import Consumer

QUORUM_DEFAULT_PREFETCH = 2000
QUORUM_DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4.x; 3.10 had none
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_TYPES = ("classic", "quorum")

DeadLetter = Callable[["Queue", Message, str], None]


class QueueArguments:
    """The x-arguments a queue honours, validated the way RabbitMQ 3.10 does."""

    def __init__(self, name: str, args: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool) -> None:
        self.max_length = _non_negative(name, args, "x-max-length")
        self.message_ttl = _non_negative(name, args, "x-message-ttl")
        overflow = args.get("x-overflow", "drop-head")
        overflow = overflow.decode() if isinstance(overflow, bytes) else overflow
        if overflow not in OVERFLOW_MODES:
            raise errors.PreconditionFailed(
                f"invalid arg 'x-overflow' for queue '{name}' in vhost '/': {{unknown_overflow_value,<<\"{overflow}\">>}}"
            )
        self.overflow: str = overflow
        kind = args.get("x-queue-type", "classic")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind not in QUEUE_TYPES:
            raise errors.PreconditionFailed(
                f"invalid arg 'x-queue-type' for queue '{name}' in vhost '/': {{unsupported_value,<<\"{kind}\">>}}"
            )
        self.kind: str = kind
        if kind == "quorum":  # RabbitMQ's order, as for streams: auto-delete, then exclusive, then non-durable
            for refused, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
                if refused:
                    raise errors.PreconditionFailed(f"invalid property '{prop}' for queue '{name}' in vhost '/'")
        self.delivery_limit: int | None = None
        if kind == "quorum":
            limit = args.get("x-delivery-limit", QUORUM_DEFAULT_DELIVERY_LIMIT)
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise errors.PreconditionFailed(
                    f"invalid arg 'x-delivery-limit' for queue '{name}' in vhost '/': {{unacceptable_type,{type(limit).__name__}}}"
                )
            self.delivery_limit = limit if limit >= 0 else None  # -1: no limit (4.0+)
        dlx = args.get("x-dead-letter-exchange")
        self.dead_letter_exchange: str | None = dlx.decode() if isinstance(dlx, bytes) else dlx
        dlrk = args.get("x-dead-letter-routing-key")
        self.dead_letter_routing_key: str | None = dlrk.decode() if isinstance(dlrk, bytes) else dlrk


def _non_negative(queue: str, args: dict[str, Any], key: str) -> int | None:
    if key not in args:
        return None
    value = args[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.PreconditionFailed(
            f"invalid arg '{key}' for queue '{queue}' in vhost '/': {{unacceptable_type,{type(value).__name__}}}"
        )
    if value < 0:
        raise errors.PreconditionFailed(f"invalid arg '{key}' for queue '{queue}' in vhost '/': {{value_negative,{value}}}")
    return value


class Queue:
    is_stream = False

    def __init__(
        self,
        name: str,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: dict[str, Any],
        dead_letter: DeadLetter,
    ) -> None:
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.args = QueueArguments(name, arguments, durable, exclusive_owner is not None, auto_delete)
        self.ready: deque[Message] = deque()
        self.consumers: list[Consumer] = []
        self.deleted = False
        self.had_consumer = False
        self.unacked = 0  # delivered on some channel and not yet settled
        self._dead_letter = dead_letter
        self._next_seq = 0
        self._rr = 0
        self._expiry_timer: asyncio.TimerHandle | None = None

    @property
    def is_quorum(self) -> bool:
        return self.args.kind == "quorum"

    @property
    def message_count(self) -> int:
        self.expire_head()
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- publishing -------------------------------------------------------

    def publish(self, message: Message, now: float) -> bool:
        """Enqueue; False when reject-publish refuses it (the confirm becomes a nack)."""
        args = self.args
        limit = args.max_length
        if limit is not None and len(self.ready) >= limit and args.overflow != "drop-head":
            if args.overflow == "reject-publish-dlx":
                self._dead_letter(self, message, "rejected")
            return False
        self._next_seq += 1
        message.seq = self._next_seq
        ttl = args.message_ttl
        per_message = message.expiration_ms()
        if per_message is not None:
            ttl = per_message if ttl is None else min(ttl, per_message)
        if ttl is not None:
            if ttl == 0 and not self._consumer_ready():
                self._dead_letter(self, message, "expired")
                return True
            message.expires_at = now + ttl / 1000.0
        self.ready.append(message)
        if limit is not None:
            while len(self.ready) > limit:
                self._dead_letter(self, self.ready.popleft(), "maxlen")
        self.dispatch()
        if self.ready and self.ready[0].expires_at and self._expiry_timer is None:
            self._schedule_expiry()
        return True

    # -- consuming --------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        if self.is_quorum:  # RabbitMQ (3.10 to 4.3) ignores exclusive on a quorum queue's basic.consume
            self.consumers.append(consumer)
            self.had_consumer = True
            return
        if consumer.exclusive and self.consumers:
            raise errors.AccessRefused(f"queue '{self.name}' in vhost '/' in exclusive use")
        if any(c.exclusive for c in self.consumers):
            raise errors.AccessRefused(f"queue '{self.name}' in vhost '/' in exclusive use")
        self.consumers.append(consumer)
        self.had_consumer = True

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def _consumer_ready(self) -> bool:
        return any(c.can_take() for c in self.consumers)

    def dispatch(self) -> None:
        ready = self.ready
        consumers = self.consumers
        if not ready or not consumers:
            return
        n = len(consumers)
        idx = self._rr
        now = asyncio.get_running_loop().time()
        while ready:
            for _ in range(n):
                consumer = consumers[idx % n]
                idx += 1
                if consumer.can_take():
                    break
            else:
                break
            message = ready.popleft()
            if message.expires_at and message.expires_at <= now:
                self._dead_letter(self, message, "expired")
                idx -= 1
                continue
            consumer.deliver(self, self._prepare(message, via_get=False))
        self._rr = idx % n

    def get(self) -> Message | None:
        self.expire_head()
        if not self.ready:
            return None
        return self._prepare(self.ready.popleft(), via_get=True)

    def _prepare(self, message: Message, via_get: bool) -> Message:
        # RabbitMQ 4.x quorum queues stamp the return counts on redeliveries only
        # (3.10 also stamped x-delivery-count 0 on a first basic.get).
        if self.is_quorum and message.acquired:
            message.header = with_return_counts(message.header, message.acquired, message.delivery_count)
        return message

    def requeue(self, messages: Iterable[Message], counted: bool = True) -> None:
        """Put returned deliveries back at their original positions, flagged redelivered.

        ``counted``: the return counts towards a quorum queue's delivery-limit (a reject or a
        closed channel; not a nack or recover, on RabbitMQ 4.3). Past the limit a message is
        dead-lettered, or dropped when the queue has no dead-letter exchange, as RabbitMQ does.
        """
        if self.deleted:
            return
        returned = sorted(messages, key=lambda m: m.seq)
        if not returned:
            return
        limit = self.args.delivery_limit
        kept = []
        for message in returned:
            message.redelivered = True
            message.acquired += 1
            message.delivery_count += counted
            if limit is not None and message.delivery_count > limit:
                self._dead_letter(self, message, "delivery_limit")
            else:
                kept.append(message)
        if not kept:
            return
        returned = kept
        ready = self.ready
        if not ready or returned[-1].seq < ready[0].seq:
            ready.extendleft(reversed(returned))
        else:
            merged = list(heapq.merge(returned, ready, key=lambda m: m.seq))
            ready.clear()
            ready.extend(merged)
        self.dispatch()
        if self.ready and self.ready[0].expires_at:
            self._schedule_expiry()

    def reject(self, message: Message) -> None:
        """A consumer rejected without requeue: dead-letter it if configured."""
        if not self.deleted:
            self._dead_letter(self, message, "rejected")

    # -- TTL ---------------------------------------------------------------

    def expire_head(self) -> None:
        ready = self.ready
        if not ready or not ready[0].expires_at:
            return
        now = asyncio.get_running_loop().time()
        while ready and ready[0].expires_at and ready[0].expires_at <= now:
            self._dead_letter(self, ready.popleft(), "expired")

    def _schedule_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if self.ready and self.ready[0].expires_at and not self.deleted:
            loop = asyncio.get_running_loop()
            self._expiry_timer = loop.call_at(self.ready[0].expires_at, self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        self.expire_head()
        self._schedule_expiry()

    # -- lifecycle ---------------------------------------------------------

    def purge(self) -> int:
        count = len(self.ready)
        self.ready.clear()
        return count

    def delete(self) -> int:
        self.deleted = True
        count = len(self.ready)
        self.ready.clear()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        for consumer in list(self.consumers):
            consumer.cancelled_by_server()
        self.consumers.clear()
        return count

    def equivalent(self, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]) -> str | None:
        if durable != self.durable:
            return f"inequivalent arg 'durable' for queue '{self.name}' in vhost '/': received '{_b(durable)}' but current is '{_b(self.durable)}'"
        if auto_delete != self.auto_delete:
            return f"inequivalent arg 'auto_delete' for queue '{self.name}' in vhost '/': received '{_b(auto_delete)}' but current is '{_b(self.auto_delete)}'"
        for key in ("x-max-length", "x-message-ttl", "x-overflow", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-queue-type"):
            mine = self.arguments.get(key)
            theirs = arguments.get(key)
            if mine != theirs:
                return inequivalent(self.name, key, theirs, mine)
        return None


def _b(value: bool) -> str:
    return "true" if value else "false"


def inequivalent(queue: str, key: str, theirs: Any, mine: Any) -> str:
    where = f"queue '{queue}' in vhost '/'"
    if key == "x-queue-type":  # RabbitMQ 4.x names the types (3.10: "received none but current is the value ...")
        return f"inequivalent arg '{key}' for {where}: received '{_text(theirs) or 'classic'}' but current is '{_text(mine) or 'classic'}'"
    return f"inequivalent arg '{key}' for {where}: received {_arg(theirs)} but current is {_arg(mine)}"


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _arg(value: Any) -> str:
    if value is None:
        return "none"
    return f"the value '{value}' of type '{'longstr' if isinstance(value, str) else 'signedint'}'"
