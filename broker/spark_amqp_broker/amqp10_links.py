"""AMQP 1.0 links, RabbitMQ 4.x's way: address format v2, a consumer per receiving link, outcomes for publishes.

A client's receiver on ``/queues/<q>`` is a queue consumer (``LinkConsumer``) whose credit the client sets; its
deliveries are unsettled until a disposition: ``accepted`` acks, ``released`` requeues uncounted, ``rejected``
dead-letters (or drops), ``modified`` requeues (counted when ``delivery-failed``) or, ``undeliverable-here``,
dead-letters. On a stream the source filter ``rabbitmq:stream-offset-spec`` says where to start and the Bloom
filter ``rabbitmq:stream-filter`` / ``rabbitmq:stream-match-unfiltered`` which chunks; settling deletes nothing.
A client's sender writes to ``/queues/<q>``, ``/exchanges/<e>[/<key>]`` or, with no target, to each message's
``to`` (the routing key of ``/exchanges/<e>`` is the message's ``subject``); the outcome is ``accepted`` once every
queue has it, ``released`` when none is bound, ``rejected`` saying why. ``/management`` is the management node.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from spark_amqp import errors
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Described, Symbol, UByte, UInt, encode

from . import amqp10_convert as convert
from .amqp10_expressions import Expression
from .amqp10_expressions import take as take_expressions
from .amqp10_frames import condition_of, description, parse_address
from .amqp10_publish import publish
from .consumer import Consumer
from .stream_args import start_spec
from .stream_filter import consumer_filter

if TYPE_CHECKING:
    from .amqp10_session import Session
    from .message import Message
    from .queue import Queue

# What RabbitMQ 4.x grants a publisher (its max_link_credit): topped up at half, and only while fewer messages than
# that wait for their outcome (held confirms stop a link at LINK_CREDIT, as RabbitMQ's queues' slow confirms do).
LINK_CREDIT = 170
_SERIAL = 0xFFFFFFFF
_STREAM_FILTERS = {"rabbitmq:stream-filter": "x-stream-filter", "rabbitmq:stream-match-unfiltered": "x-stream-match-unfiltered"}


def _error(condition: str, description: str) -> Described:
    return Described(P.ERROR, [Symbol(condition), description])


def attach(session: Session, fields: list[Any]) -> None:
    name, handle, client_receives = fields[0], int(fields[1]), bool(fields[2])
    source = fields[5] if len(fields) > 5 else None
    target = fields[6] if len(fields) > 6 else None
    properties = fields[13] if len(fields) > 13 and isinstance(fields[13], dict) else {}
    terminus = source if client_receives else target
    terminus_fields = list(terminus.value) if isinstance(terminus, Described) and isinstance(terminus.value, list) else []
    address = terminus_fields[0] if terminus_fields else None
    settled = len(fields) > 3 and fields[3] == 1
    reply: list[Any] = [name, UInt(handle), not client_receives, UByte(fields[3] if len(fields) > 3 and fields[3] is not None else 2)]
    reply.append(UByte(0))
    try:
        link: OutgoingLink | IncomingLink
        if client_receives:
            link = OutgoingLink(session, handle, str(name), settled)
            answered = link.start(address, terminus_fields)
            reply += [answered, target, None, None, UInt(0)]
        else:
            link = IncomingLink(session, handle, str(name))
            link.start(address)
            reply += [source, target, None, None, None, session.connection.server.max_message_size]
    except errors.AmqpReplyError as err:
        condition = "amqp:invalid-field" if isinstance(err, errors.SyntaxError_) else condition_of(err)
        # The refused terminus is a null, which the fields after it keep in place.
        reply += (
            [None, None, None, None, UInt(0)]
            if client_receives
            else [source, None, None, None, None, session.connection.server.max_message_size]
        )
        session.send(P.ATTACH, reply)
        session.send(P.DETACH, [UInt(handle), True, _error(condition, description(err))])
        return
    if properties.get(Symbol("paired")) is True or properties.get("paired") is True:
        reply += [None] * (13 - len(reply)) + [{Symbol("paired"): True}]
    session.links[handle] = link
    session.send(P.ATTACH, reply)
    link.attached()


class LinkConsumer(Consumer):
    """A queue's consumer for a receiving link: it takes what the link's credit and the session's window allow."""

    __slots__ = ("link",)
    raw_records = True  # a stream gives it its records as they are stored (stream.StreamQueue._feed)
    link: OutgoingLink

    def can_take(self) -> bool:
        link = self.link
        return link.credit > 0 and link.session.can_send

    def deliver_record(self, queue: Any, record: Any, offset: int) -> None:
        payload = convert.record_delivery(record, offset)
        expression = self.link.expression
        if expression is None or expression.matches(payload):  # else left out: its offset never comes
            self.link.send(payload, None, None)


class OutgoingLink:
    """The broker's sending end: a queue's consumer, or the management node's replies."""

    def __init__(self, session: Session, handle: int, name: str, settled: bool) -> None:
        self.session = session
        self.connection = session.connection  # Consumer.channel.connection
        self.handle = handle
        self.name = name
        self.settled = settled  # the client asked for deliveries settled (snd-settle-mode settled)
        self.open = True
        self.credit = 0
        self.delivery_count = 0
        self.queue: Queue | None = None
        self.consumer: LinkConsumer | None = None
        self.unsettled: dict[int, tuple[Queue, Message]] = {}
        self.replies: deque[bytes] | None = None  # the management node's answers, waiting for credit
        self.expression: Expression | None = None  # a stream's filter expressions (amqp10_expressions)

    def open_source(self, address: Any, terminus: list[Any]) -> Described:
        vhost = self.session.connection.server.vhost
        kind, queue_name, _ = parse_address(address)
        if kind != "queue":
            raise errors.SyntaxError_(f"a receiver reads a queue, not '{address}'")
        queue = vhost.queue(queue_name, self.session.connection)
        consumer = LinkConsumer("amqp10-" + self.name, self, queue, False, False, 0)  # type: ignore[arg-type]
        consumer.link = self
        filters = terminus[7] if len(terminus) > 7 and isinstance(terminus[7], dict) else {}
        accepted: dict[Any, Any] = {}
        if queue.is_stream:
            arguments: dict[str, Any] = {}
            for key, value in filters.items():
                if not isinstance(value, Described):
                    continue
                kind = str(value.descriptor)
                if kind == "rabbitmq:stream-offset-spec":
                    arguments["x-stream-offset"] = _offset_spec(value.value)
                elif kind in _STREAM_FILTERS:
                    arguments[_STREAM_FILTERS[kind]] = value.value
                else:
                    continue
                accepted[key] = value
            self.expression, expressions = take_expressions(filters)
            accepted.update(expressions)
            spec = start_spec(queue.name, arguments.get("x-stream-offset"))
            queue.add_consumer(consumer, (*spec, consumer_filter(arguments)))  # type: ignore[call-arg]
        else:
            queue.add_consumer(consumer)
        self.queue, self.consumer = queue, consumer
        mode = Symbol("copy" if queue.is_stream else "move")
        return Described(P.SOURCE, [address, UInt(0), Symbol("session-end"), UInt(0), False, None, mode, accepted or None])

    def start(self, address: Any, terminus: list[Any]) -> Described:
        if address == "/management":
            self.replies = deque()
            return Described(P.SOURCE, [address])
        return self.open_source(address, terminus)

    def attached(self) -> None:
        pass

    # -- Consumer.channel -------------------------------------------------------------------

    def deliver(self, consumer: Consumer, queue: Queue, message: Message) -> None:
        self.send(convert.delivery_bytes(message, queue.is_quorum), queue, message)

    def send(self, payload: bytes, queue: Queue | None, message: Message | None) -> None:
        """One delivery: tracked until settled when ``queue`` and ``message`` say what to give back; a stream's goes
        unsettled too (the client settles it, which deletes nothing), the management node's settled."""
        delivery_id = self.session.transfer(self.handle, payload, self.settled or self.replies is not None)
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & _SERIAL
        if queue is not None and message is not None and not self.settled:
            self.unsettled[delivery_id] = (queue, message)
            self.session.unsettled[delivery_id] = self
            queue.unacked += 1
            if self.consumer is not None:
                self.consumer.unacked += 1

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        """The queue was deleted: RabbitMQ detaches the link, saying so."""
        if self.session.links.get(self.handle) is self:
            del self.session.links[self.handle]
            self.unsettled.clear()
            self.open = False
            text = f"queue '{consumer.queue.name}' in vhost '/' deleted"
            self.session.send(P.DETACH, [UInt(self.handle), True, _error("amqp:resource-deleted", text)])

    # -- credit and settlement ---------------------------------------------------------------

    def on_flow(self, fields: list[Any]) -> None:
        their_count = fields[5] if len(fields) > 5 and fields[5] is not None else self.delivery_count
        credit = ((int(their_count) + int(fields[6] or 0) - self.delivery_count + (1 << 31)) & _SERIAL) - (1 << 31)
        self.credit = max(credit, 0)
        drain = len(fields) > 8 and bool(fields[8])
        echo = len(fields) > 9 and bool(fields[9])
        self.wake()
        if drain and self.credit:
            self.delivery_count = (self.delivery_count + self.credit) & _SERIAL
            self.credit = 0
        if drain or echo:
            queue = self.queue
            available = None if queue is None or queue.is_stream else UInt(queue.message_count)
            self.session.flow([UInt(self.handle), UInt(self.delivery_count), UInt(self.credit), available, drain, False])

    def wake(self) -> None:
        if self.replies is not None:
            while self.replies and self.credit > 0 and self.session.can_send:
                self.send(self.replies.popleft(), None, None)
        elif self.queue is not None and self.credit > 0:
            self.queue.dispatch()

    def reply(self, payload: bytes) -> None:
        assert self.replies is not None
        self.replies.append(payload)
        self.wake()

    def settle(self, ids: list[int], state: Any) -> None:
        code = getattr(state, "descriptor", P.RELEASED)
        values = getattr(state, "value", None) or []
        taken = [entry for entry in (self.unsettled.pop(i, None) for i in ids) if entry is not None]
        if not taken:
            return
        self._settle(taken, code, values)

    def _settle(self, taken: list[tuple[Queue, Message]], code: Any, values: list[Any]) -> None:
        by_queue: dict[Queue, list[Message]] = {}
        for queue, message in taken:
            queue.unacked -= 1
            by_queue.setdefault(queue, []).append(message)
        if self.consumer is not None:
            self.consumer.unacked -= len(taken)
        failed = bool(values[0]) if code == P.MODIFIED and values else False
        elsewhere = len(values) > 1 and bool(values[1]) if code == P.MODIFIED else False
        if code == P.MODIFIED and len(values) > 2 and isinstance(values[2], dict) and values[2]:
            for _, message in taken:
                _annotate(message, values[2])
        for queue, messages in by_queue.items():
            if code == P.ACCEPTED:
                pass
            elif code == P.REJECTED or (code == P.MODIFIED and elsewhere):
                for message in messages:  # a failed delivery, as RabbitMQ counts it, but for modified's say
                    message.delivery_count += code == P.REJECTED or failed
                    queue.reject(message)
            elif code == P.MODIFIED:
                queue.requeue(messages, counted=failed)
            else:  # released, or no outcome (RabbitMQ's default outcome is released)
                queue.requeue(messages, counted=False)
            queue.dispatch()

    def detached(self, by_detach: bool = False) -> None:
        """The link ended: its unsettled deliveries go back. RabbitMQ 4.3 counts them as failed deliveries, but for a
        quorum queue's when the client detached the link (its session and connection going count there too)."""
        self.open = False
        queue, consumer = self.queue, self.consumer
        if queue is None or consumer is None:
            return
        queue.remove_consumer(consumer)
        taken = list(self.unsettled.items())
        self.unsettled.clear()
        for delivery_id, _ in taken:
            self.session.unsettled.pop(delivery_id, None)
        by_queue: dict[Queue, list[Message]] = {}
        for _, (q, message) in taken:
            q.unacked -= 1
            by_queue.setdefault(q, []).append(message)
        for q, messages in by_queue.items():
            q.requeue(messages, counted=not (by_detach and q.is_quorum))
        self.session.connection.server.vhost.consumer_gone(queue)


def _offset_spec(value: Any) -> Any:
    """RabbitMQ's x-stream-offset for the filter's value: a timestamp to the second, text, or an offset."""
    import datetime

    from spark_amqp.amqp10.types import Timestamp

    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(int(value) // 1000, datetime.UTC)
    return value


def _annotate(message: Message, annotations: dict[Any, Any]) -> None:
    form = convert.form_of(message)
    added = {str(k): encode(Symbol(str(k))) + encode(v) for k, v in annotations.items() if str(k).startswith("x-")}
    kept = [(k, pair) for k, pair in form.annotations if k not in added]
    message.amqp10 = convert.Form(form.durable, form.priority, form.ttl, [*kept, *added.items()], form.bare)


class IncomingLink:
    """The broker's receiving end: a publisher (``amqp10_publish``), or the management node's requests."""

    def __init__(self, session: Session, handle: int, name: str) -> None:
        self.session = session
        self.handle = handle
        self.name = name
        self.target: tuple[str, str, str | None] | None = None  # None: each message's ``to``
        self.management = False
        self.blocked = False  # credit withheld for an alarm
        self.delivery_count = 0
        self.credit = 0
        self.unconfirmed = 0  # messages whose outcome is not sent yet
        self._parts: list[bytes] = []
        self._size = 0
        self._delivery: tuple[int, bool] | None = None  # (delivery id, settled) of the message being received

    def start(self, address: Any) -> None:
        if address == "/management":
            self.management = True
            return
        if address is None:
            return  # the anonymous terminus
        vhost = self.session.connection.server.vhost
        kind, name, key = parse_address(address)
        if kind == "queue":
            vhost.queue(name, self.session.connection)
        else:
            vhost.exchange(name)
        self.target = (kind, name, key)

    def attached(self) -> None:
        self.grant()

    def grant(self) -> None:
        """Credit to LINK_CREDIT; none during a memory or disk alarm (RabbitMQ blocks publishers so), until it clears."""
        self.blocked = not self.management and self.session.connection.server.faults.alarm is not None
        if not self.blocked:
            self.credit = LINK_CREDIT
            self.session.flow([UInt(self.handle), UInt(self.delivery_count), UInt(self.credit)])

    def on_flow(self, fields: list[Any]) -> None:
        if len(fields) > 9 and fields[9]:
            self.session.flow([UInt(self.handle), UInt(self.delivery_count), UInt(self.credit)])

    def detached(self, by_detach: bool = False) -> None:
        self._parts = []

    def on_transfer(self, fields: list[Any], payload: bytes) -> None:
        if self._delivery is None:
            self._delivery = (int(fields[1]), len(fields) > 4 and bool(fields[4]))
        self._parts.append(payload)
        self._size += len(payload)
        if len(fields) > 5 and fields[5]:
            return
        raw = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        delivery_id, settled = self._delivery
        self._parts, self._size, self._delivery = [], 0, None
        self.delivery_count = (self.delivery_count + 1) & _SERIAL
        self.credit -= 1
        if self.management:
            self._top_up()
            from .amqp10_management import answer

            answer(self.session, self.name, raw)
            return
        limit = self.session.connection.server.max_message_size
        if len(raw) > limit:
            text = f"message size ({len(raw)} bytes) > maximum message size ({limit} bytes)"
            self.session.links.pop(self.handle, None)
            self.session.send(P.DETACH, [UInt(self.handle), True, _error("amqp:link:message-size-exceeded", text)])
            return
        outcome = publish(self.session.connection, self.target, raw)
        if not settled:
            self.unconfirmed += 1
            self.session.outcome(delivery_id, outcome, self)
        self._top_up()

    def confirmed(self, count: int) -> None:
        """``count`` outcomes went out: credit may be topped up again."""
        self.unconfirmed -= count
        if self.handle in self.session.links:
            self._top_up()

    def _top_up(self) -> None:
        if self.credit <= LINK_CREDIT // 2 and self.unconfirmed < LINK_CREDIT:
            self.grant()


__all__ = ["LINK_CREDIT", "IncomingLink", "LinkConsumer", "OutgoingLink", "attach"]
