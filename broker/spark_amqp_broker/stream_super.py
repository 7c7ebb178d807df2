"""Creating streams and super streams over the stream protocol, and a super stream's partitions and routes.

A super stream is an exchange whose bindings to streams are its partitions, ordered by
the ``x-stream-partition-order`` binding argument (bindings without one come last, in the
order they were made). RabbitMQ does not check that the exchange was declared as a super
stream (``x-super-stream``): any exchange answers ``partitions`` and ``route``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from spark_amqp import errors
from spark_amqp.stream_protocol.wire import OK, Key, Reader, response, strings

from . import codec
from .message import Message
from .stream_args import create_arguments

if TYPE_CHECKING:
    from .queue import Queue
    from .server import BrokerServer
    from .stream import StreamQueue

STREAM_DOES_NOT_EXIST, STREAM_EXISTS, INTERNAL_ERROR, PRECONDITION_FAILED = 0x02, 0x05, 0x0F, 0x11
MAX_PARTITIONS = 1000  # RabbitMQ's default max_super_stream_partitions
# Checked on a second create of a stream besides those the AMQP 0-9-1 declare checks (RabbitMQ 4.3's list).
_ALSO_EQUIVALENT = ("x-stream-filter-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator")
_NO_PROPERTIES = codec.join_properties(0, [])


class StreamSuper:
    """Mixed into ``StreamCommands``."""

    server: BrokerServer

    if TYPE_CHECKING:

        def write(self, data: bytes) -> None: ...
        def stream(self, name: str) -> StreamQueue | None: ...

    def create_stream(self, name: str, given: dict[str, str]) -> int:
        """A stream-protocol ``create``: its response code."""
        name = name.replace("\n", "").replace("\r", "")
        if not name or name.startswith("amq."):
            return PRECONDITION_FAILED
        arguments = create_arguments(given)
        if arguments is None:
            return PRECONDITION_FAILED
        vhost = self.server.vhost
        existing = vhost.queues.get(name)
        if existing is not None:
            if existing.equivalent(True, False, False, arguments) is not None:
                return PRECONDITION_FAILED
            if any(existing.arguments.get(key) != arguments.get(key) for key in _ALSO_EQUIVALENT):
                return PRECONDITION_FAILED
            return STREAM_EXISTS
        try:
            vhost.declare_queue(name, False, True, False, False, arguments, None)
        except errors.AmqpReplyError:
            return PRECONDITION_FAILED
        return OK

    def partition_names(self, super_stream: str) -> list[str] | None:
        exchange = self.server.vhost.exchanges.get(super_stream)
        if exchange is None:
            return None
        bound = [b for b in exchange.bindings if getattr(b.queue, "is_stream", False)]
        bound.sort(key=lambda b: _order(b.arguments))
        return [b.queue.name for b in bound]

    def partitions(self, r: Reader, _version: int) -> None:
        correlation, super_stream = r.u32(), r.text()
        names = self.partition_names(super_stream)
        code = STREAM_DOES_NOT_EXIST if names is None else OK
        self.write(response(Key.PARTITIONS, correlation, code, strings(names or [])))

    def route(self, r: Reader, _version: int) -> None:
        correlation, routing_key, super_stream = r.u32(), r.text(), r.text()
        vhost = self.server.vhost
        exchange = vhost.exchanges.get(super_stream)
        if exchange is None:
            self.write(response(Key.ROUTE, correlation, STREAM_DOES_NOT_EXIST, strings([])))
            return
        probe = Message(super_stream, routing_key, _NO_PROPERTIES, b"")
        targets = vhost._through(exchange, probe)  # routing that ignores `internal`, as RabbitMQ's does
        self.write(response(Key.ROUTE, correlation, OK, strings([q.name for q in targets if q.is_stream])))

    def create_super_stream(self, r: Reader, _version: int) -> None:
        correlation, name = r.u32(), r.text().replace("\n", "").replace("\r", "")
        partitions, keys, given = r.strings(), r.strings(), r.map()
        self.write(response(0x1D, correlation, self._create_super_stream(name, partitions, keys, given)))

    def _create_super_stream(self, name: str, partitions: list[str], keys: list[str], given: dict[str, str]) -> int:
        vhost = self.server.vhost
        if not name or name.startswith("amq.") or len(partitions) != len(keys) or len(set(partitions)) != len(partitions):
            return PRECONDITION_FAILED
        if any(not p or p.startswith("amq.") for p in partitions) or len(partitions) > MAX_PARTITIONS:
            return PRECONDITION_FAILED
        if name in vhost.exchanges or any(p in vhost.queues for p in partitions):
            return STREAM_EXISTS
        vhost.declare_exchange(name, "direct", False, True, False, False, {"x-super-stream": True})
        created: list[str] = []
        for partition in partitions:
            if self.create_stream(partition, {"queue-leader-locator": "balanced", **given}) != OK:
                # RabbitMQ rolls back; the refusal reaches the client as an internal error.
                for done in created:
                    vhost.remove_queue(vhost.queues[done])
                vhost.delete_exchange(name, False)
                return INTERNAL_ERROR
            created.append(partition)
        for order, (partition, key) in enumerate(zip(partitions, keys, strict=True)):
            vhost.bind(partition, name, key, {"x-stream-partition-order": order}, None)
        return OK

    def delete_super_stream(self, r: Reader, _version: int) -> None:
        correlation, name = r.u32(), r.text()
        names = self.partition_names(name)
        if names is None:
            self.write(response(0x1E, correlation, STREAM_DOES_NOT_EXIST))
            return
        # Answered first: metadata updates for the partitions follow, as on RabbitMQ.
        self.write(response(0x1E, correlation, OK))
        vhost = self.server.vhost
        vhost.delete_exchange(name, False)
        for partition in names:
            queue = self.stream(partition)
            if queue is not None:
                vhost.remove_queue(cast("Queue", queue))


def _order(arguments: dict[str, Any]) -> tuple[int, int]:
    value = arguments.get("x-stream-partition-order")
    try:
        return (0, int(value)) if value is not None else (1, 0)
    except (TypeError, ValueError):
        return (1, 0)
