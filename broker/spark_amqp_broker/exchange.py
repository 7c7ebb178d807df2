"""Exchanges and how each type routes a message to its bound queues and exchanges."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from .message import Message
    from .queue import Queue

    # A binding's destination: a queue (of any type), or an exchange (exchange.bind).
    Destination: TypeAlias = "Queue | Exchange"


class Binding:
    __slots__ = ("arguments", "queue", "routing_key")

    def __init__(self, queue: Destination, routing_key: str, arguments: dict[str, Any]) -> None:
        self.queue = queue  # the destination, queue or exchange
        self.routing_key = routing_key
        self.arguments = arguments

    def same_as(self, queue: Destination, routing_key: str, arguments: dict[str, Any]) -> bool:
        return self.queue is queue and self.routing_key == routing_key and self.arguments == arguments


class Exchange:
    def __init__(
        self,
        name: str,
        kind: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: list[Binding] = []
        # direct exchanges route on an exact key: index them for O(1) routing.
        self._by_key: dict[str, list[Destination]] = {}
        self.to_exchanges = 0  # bindings whose destination is an exchange: routing must follow them

    def bind(self, queue: Destination, routing_key: str, arguments: dict[str, Any]) -> None:
        if any(b.same_as(queue, routing_key, arguments) for b in self.bindings):
            return
        self.bindings.append(Binding(queue, routing_key, arguments))
        self._by_key.setdefault(routing_key, []).append(queue)
        self.to_exchanges += isinstance(queue, Exchange)

    def unbind(self, queue: Destination, routing_key: str, arguments: dict[str, Any]) -> bool:
        for binding in self.bindings:
            if binding.same_as(queue, routing_key, arguments):
                self.bindings.remove(binding)
                self._reindex()
                return True
        return False

    def unbind_queue(self, queue: Destination) -> None:
        before = len(self.bindings)
        self.bindings = [b for b in self.bindings if b.queue is not queue]
        if len(self.bindings) != before:
            self._reindex()

    def _reindex(self) -> None:
        self._by_key = {}
        for b in self.bindings:
            self._by_key.setdefault(b.routing_key, []).append(b.queue)
        self.to_exchanges = sum(isinstance(b.queue, Exchange) for b in self.bindings)

    def route(self, message: Message) -> list[Destination]:
        if self.kind == "direct":
            queues = self._by_key.get(message.routing_key)
            return _unique(queues) if queues else []
        if self.kind == "fanout":
            return _unique([b.queue for b in self.bindings])
        if self.kind == "topic":
            key = message.routing_key
            return _unique([b.queue for b in self.bindings if topic_matches(b.routing_key, key)])
        if self.kind == "headers":
            if not self.bindings:
                return []
            headers = message.headers()
            return _unique([b.queue for b in self.bindings if headers_match(b.arguments, headers)])
        return []

    def equivalent(self, kind: str, durable: bool, auto_delete: bool, internal: bool, arguments: dict[str, Any]) -> str | None:
        """The name of the first property that differs, as RabbitMQ reports it."""
        if kind != self.kind:
            return "type"
        if durable != self.durable:
            return "durable"
        if auto_delete != self.auto_delete:
            return "auto_delete"
        if internal != self.internal:
            return "internal"
        return None


def _unique(queues: list[Destination]) -> list[Destination]:
    if len(queues) < 2:
        return list(queues)
    return list(dict.fromkeys(queues))


def topic_matches(pattern: str, routing_key: str) -> bool:
    """'*' matches exactly one word, '#' zero or more; words are split on dots."""
    if pattern == routing_key:
        return True
    key = routing_key.split(".")
    positions = {0}
    for word in pattern.split("."):
        if word == "#":
            low = min(positions)
            positions = set(range(low, len(key) + 1))
        else:
            positions = {i + 1 for i in positions if i < len(key) and (word == "*" or key[i] == word)}
        if not positions:
            return False
    return len(key) in positions


def headers_match(binding_args: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = binding_args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    with_x = mode in ("all-with-x", "any-with-x")
    wanted = {k: v for k, v in binding_args.items() if k != "x-match" and (with_x or not k.startswith("x-"))}
    if mode in ("any", "any-with-x"):
        return any(_header_equal(k, v, headers) for k, v in wanted.items())
    return all(_header_equal(k, v, headers) for k, v in wanted.items())


def _header_equal(key: str, expected: Any, headers: dict[str, Any]) -> bool:
    if key not in headers:
        return False
    if expected is None:  # a void binding value matches presence alone
        return True
    return bool(headers[key] == expected)
