"""A message published over AMQP 1.0: where it goes, what each queue makes of it, and the outcome RabbitMQ 4.x gives.

``accepted`` once every queue it was routed to has it; ``released`` when it was routed to none (RabbitMQ returns an
unroutable message so, ``mandatory`` or not); ``rejected`` with RabbitMQ's error: a queue full with
``x-overflow: reject-publish`` (``amqp:resource-limit-exceeded``, naming the queue), a missing exchange or queue
named by ``to`` (``amqp:not-found``), an address that is none (``amqp:invalid-field``). A stream stores the message
as RabbitMQ does, as AMQP 1.0 (``amqp10_convert.stream_record``); other queues hold its AMQP 0-9-1 conversion beside
its own sections (``amqp10_convert.message_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from spark_amqp import errors
from spark_amqp.amqp10.performatives import Outcome
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Described, Symbol, encode

from . import amqp10_convert as convert
from .amqp10_frames import condition_of, description, parse_address

if TYPE_CHECKING:
    from .amqp10_connection import Amqp10Connection
    from .stream import StreamQueue

__all__ = ["publish"]


def _rejected(condition: str, description: str, info: dict[Any, Any] | None = None) -> bytes:
    fields: list[Any] = [Symbol(condition), description]
    if info:
        fields.append(info)
    return encode(Described(P.REJECTED, [Described(P.ERROR, fields)]))


def _route(connection: Amqp10Connection, target: tuple[str, str, str | None] | None, form: convert.Form) -> tuple[str, str]:
    """(exchange, routing key) for the link's target, else for the message's ``to`` (the anonymous terminus)."""
    props = convert.properties(form) if target is None or (target[0] == "exchange" and target[2] is None) else []
    if target is None:
        to = props[2] if len(props) > 2 else None
        if to is None:
            raise errors.SyntaxError_("message has no 'to' field set (anonymous terminus)")
        target = parse_address(to)
        if target[0] == "exchange":
            connection.server.vhost.exchange(target[1])
    kind, name, key = target
    if kind == "queue":
        connection.server.vhost.queue(name, connection)
        return "", name
    if key is None:
        subject = props[3] if len(props) > 3 else None
        key = subject if isinstance(subject, str) else ""
    return name, key


def publish(connection: Amqp10Connection, target: tuple[str, str, str | None] | None, raw: bytes) -> bytes:
    """Route and enqueue ``raw`` (a whole message); the outcome's encoding."""
    server = connection.server
    try:
        form, known = convert.received(raw)
        exchange, key = _route(connection, target, form)
        message = convert.message_of(form, exchange, key, known, raw)
        queues = server.vhost.route(exchange, message)
    except errors.SyntaxError_ as err:
        return _rejected("amqp:invalid-field", description(err))
    except errors.DecodeError as err:
        return _rejected("amqp:decode-error", str(err))
    except errors.AmqpReplyError as err:
        return _rejected(condition_of(err), description(err))
    if server.faults.take("nack_publishes"):
        return _rejected("amqp:internal-error", "not enqueued (fault injection: nack_next_publishes)")
    if not queues:
        return Outcome.RELEASED
    now = server.loop.time()
    refused = None
    for i, queue in enumerate(queues):
        if queue.is_stream:
            cast("StreamQueue", queue).publish(convert.stream_record(form, exchange, key), now)
        elif not queue.publish(message if i == 0 else message.copy_for_queue(), now) and refused is None:
            refused = queue.name
    if refused is not None:
        info = {Symbol("queue"): refused, Symbol("reason"): Symbol("maxlen")}
        return _rejected("amqp:resource-limit-exceeded", f"queue '{refused}' exceeded maximum length", info)
    return Outcome.ACCEPTED
