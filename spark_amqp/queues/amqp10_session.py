"""``Amqp10Session``: the source runner's connection over AMQP 1.0 (an ``IoSession``; ``protocol=amqp1.0``).

One receiver link per queue, every delivery unsettled. A link's credit plays the part of AMQP 0-9-1's prefetch:
it is topped up so that what is unsettled plus what may still come never passes option ``prefetch``. Delivery ids
become the ledger's tags (unwrapped past 2^32: they are serial numbers). A multi-ack up to a tag settles the
link's unsettled ids up to it as ``accepted``, one disposition for each run of consecutive ids (the links of one
session share the ids); an echoed flow, answered only after the broker processed what came before it, proves the
round, as ``basic.qos`` does over 0-9-1. A link that ends takes its unsettled deliveries back to the queue (RabbitMQ
4.3.6 counts a lost or closed connection's as a return on a quorum queue, as over 0-9-1, a detach's only on a classic
one); a stopping query releases them first, which it never counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ..amqp10.performatives import Outcome
from ..amqp10.types import Symbol
from ..amqp10_client import Amqp10Client
from ..amqp10_client.links import Receiver
from ..amqp10_client.management import bind, declare_queue, queue_info
from ..errors import AmqpProtocolError, AmqpSourceError, ConnectionLost, OtherConsumers, StreamInQueueMode, is_transient
from ..stream_protocol.rows import STANDARD, Conversion
from ..transport.backoff import Backoff
from .amqp10_rows import QueueRows
from .channel_policy import ChannelPolicy
from .inbox import AckConfirmed, Delivery, SessionClosed
from .io_session import IoSession
from .options import SourceOptions

log = logging.getLogger("spark_amqp.queues")

_ID = 0xFFFFFFFF


class _Link:
    """One queue's receiver link: its unsettled delivery tags as runs of consecutive tags, oldest first."""

    def __init__(self, session: str, queue: str) -> None:
        self.session = session
        self.queue = queue
        self.receiver: Receiver | None = None
        self.runs: deque[list[int]] = deque()
        self.singles: set[int] = set()  # settled on their own, still inside a run
        self.unsettled = 0

    def add(self, tag: int) -> None:
        runs = self.runs
        if runs and runs[-1][1] == tag - 1:
            runs[-1][1] = tag
        else:
            runs.append([tag, tag])
        self.unsettled += 1

    def up_to(self, multiple: int) -> list[tuple[int, int]]:
        """The runs of unsettled tags up to ``multiple``, taken out."""
        taken: list[tuple[int, int]] = []
        runs = self.runs
        while runs and runs[0][0] <= multiple:
            first, last = runs[0]
            if last <= multiple:
                runs.popleft()
            else:
                runs[0][0] = multiple + 1
                last = multiple
            taken.append((first, last))
            self.unsettled -= last - first + 1
        if self.singles:
            inside = {t for t in self.singles if t <= multiple}
            self.singles -= inside
            self.unsettled += len(inside)  # counted once already, when settled on their own
        return taken

    def single(self, tag: int) -> None:
        self.singles.add(tag)
        self.unsettled -= 1


class Amqp10Session(IoSession):
    client_class = Amqp10Client

    def __init__(self, options: SourceOptions, run_id: str) -> None:
        super().__init__(options, run_id)
        self._links: dict[str, _Link] = {}  # session id -> link
        self._policy = ChannelPolicy(options)  # what another consumer on an exclusive queue means
        self._paused = False
        self._wraps = 0  # the connection's delivery ids went past 2^32 this often
        self._last_id = -1

    # -- runner-thread API ------------------------------------------------

    def ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        """Settle ``session``'s deliveries up to ``multiple`` and ``singles`` as accepted, if its link is still
        attached; then ``AckConfirmed(session, ack_round)`` once the broker's answer to an echo proves them."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._ack, session, multiple, singles, ack_round)

    def dead_letter(self, settlements: list[tuple[str, int, str]]) -> None:
        """Settle each (session, tag, reason) ``modified`` as undeliverable here: RabbitMQ dead-letters the message (drops
        it, where the queue has no dead-letter exchange), annotated ``x-opt-spark-amqp-reason``. A link already gone gave
        it back to the queue: it comes again, and is dead-lettered then."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._dead_letter, settlements)

    def pause(self, timeout: float = 10.0) -> None:
        """Take every link's credit away and wait for the broker's answer: after this, nothing more arrives."""
        self._call(self._pause, timeout)

    def resume(self, timeout: float = 10.0) -> None:
        self._call(self._resume, timeout)

    def ready_counts(self, timeout: float) -> dict[str, int]:
        """Messages ready on the broker per queue: the ``available`` each link's last flow from the broker reported.
        An echo asks for fresh ones, for the next call: its answer queues behind the transfers the broker already
        sent (up to the prefetch window), and waiting for it held each batch's planning up by 0.7 s (measured)."""
        return self._call(self._ready_counts, timeout)

    def settle(self, queues: list[str], timeout: float) -> bool:
        """Whether every transfer the broker sent ``queues``' links before this call has arrived: an echo on each,
        answered behind them. False where a queue has no attached link, or one went meanwhile."""
        return self._call(lambda: self._settle(queues), timeout)

    # -- I/O thread -------------------------------------------------------------

    async def _serve(self, client: Amqp10Client, queue: str) -> None:
        backoff = Backoff()
        # Artemis marks a redelivery only sometimes (delivery-count 1 after some lost connections, never after a
        # release, a detach or a clean close): there Intake checks every delivery against the copies it expects.
        self.marks_redeliveries = client.rabbitmq
        rows = QueueRows(queue, Conversion.of(client.server_version) if client.rabbitmq else STANDARD)
        try:
            await self._prepare(client, queue)
        except ConnectionLost:
            return
        except AmqpProtocolError as err:
            self._fail(self._error(err, queue))
            return
        while not self._stopping and self.fatal is None and not client.closed.done():
            self._epoch += 1
            link = _Link(f"{self.run_id}.{self._epoch}", queue)
            self._links[link.session] = link
            try:
                link.receiver = await client.receiver(client.queue_address(queue), self._on_delivery(client, link, rows))
            except ConnectionLost:
                return  # the connection is going (or did not answer): _run decides what next
            except AmqpProtocolError as err:
                # A refused attach (no such queue, no permission, Artemis's "not configured for queue support": a
                # multicast address) is the same the next time: the query fails, saying why.
                self._lost(link, str(err))
                self._fail(self._error(err, queue))
                return
            else:
                source = link.receiver.attached.result()[5]
                if getattr(source, "value", None) and len(source.value) > 6 and source.value[6] == "copy":
                    # RabbitMQ 4.3 says a stream's link copies (it does not take messages away): not a queue
                    # to read here. (4.0 does not say: its first delivery's x-stream-offset does.)
                    await link.receiver.detach()
                    self._lost(link, "a stream")
                    self._on_link_error(queue, StreamInQueueMode(queue))
                    return
                if self.options.exclusive_consumer:
                    # AMQP 1.0 has no exclusive subscription: count the queue's consumers, ours included.
                    try:
                        consumers = int((await queue_info(client, queue)).get("consumer_count") or 0)
                    except ConnectionLost:
                        return
                    if consumers > 1:
                        await link.receiver.detach()  # before any credit: nothing was delivered
                        self._lost(link, f"{consumers} consumers")
                        if self._on_link_error(queue, OtherConsumers(queue, consumers)):
                            return
                        await asyncio.sleep(backoff.next())
                        continue
                if not self._paused:
                    link.receiver.grant(self.options.prefetch)
                self._policy.subscribed(queue)
                self._subscribed(queue)
                backoff.reset()
                reason: AmqpProtocolError | None = await link.receiver.closed
            if client.closed.done():
                return  # the connection is going: _run decides what next
            self._lost(link, str(reason) if reason is not None else "detached")
            if reason is None or self._on_link_error(queue, reason):
                return
            await asyncio.sleep(backoff.next())

    def _on_delivery(self, client: Amqp10Client, link: _Link, rows: QueueRows) -> Any:
        inbox, session, queue = self.inbox, link.session, link.queue
        make = tuple.__new__
        first = True

        def on_delivery(delivery_id: int, message: bytes) -> None:
            nonlocal first
            if delivery_id < self._last_id and self._last_id - delivery_id > 1 << 31:
                self._wraps += 1
            self._last_id = delivery_id
            tag = (self._wraps << 32) | delivery_id
            link.add(tag)
            body, exchange, key, props = rows.row(message)
            if first:
                first = False
                if b"x-stream-offset" in message[: len(message) - len(body)]:
                    self._on_link_error(queue, StreamInQueueMode(queue))
                    return
            inbox.append(make(Delivery, (session, queue, tag, props.redelivered, exchange, key, props, body)))

        return on_delivery

    def _lost_all(self, reason: str) -> None:
        for link in list(self._links.values()):
            self._lost(link, reason)

    def _lost(self, link: _Link, reason: str) -> None:
        if self._links.pop(link.session, None) is not None:
            self._consuming.discard(link.queue)
            self.inbox.append(SessionClosed(link.session, link.queue, reason))

    async def _prepare(self, client: Amqp10Client, queue: str) -> None:
        """On RabbitMQ, through its management node: declare and bind the queue (option declareQueue), and refuse a
        stream before attaching (4.0 says nothing at the attach). Elsewhere the options that need the node fail."""
        declaration = self.options.declaration
        if not client.rabbitmq:
            needs = [k for k, v in (("declareQueue", declaration), ("exclusiveConsumer", self.options.exclusive_consumer)) if v]
            if needs:
                product = client.server_properties.get("product", "this broker")
                fix = "declare the queue with the broker's tools" if needs[0] == "declareQueue" else "set exclusiveConsumer=false"
                raise AmqpSourceError(
                    f"option '{needs[0]}' over AMQP 1.0 needs RabbitMQ's management node, which {product} does not have: "
                    f"{fix} (with a journal, keep other consumers off the queue yourself)"
                )
            return
        if declaration is not None:
            await declare_queue(client, queue, declaration.durable, declaration.arguments)
            if declaration.exchange:
                await bind(client, declaration.exchange, queue, declaration.binding_key)
        if (await queue_info(client, queue)).get("type") == "stream":
            raise StreamInQueueMode(queue)

    def _on_link_error(self, queue: str, reason: AmqpProtocolError) -> bool:
        """True when the broker's end of a link is fatal for the query (then the query fails with why); a transient
        one (a queue's leader moving, a forced detach) is logged, and the link attached again."""
        if isinstance(reason, OtherConsumers):
            message = self._policy.failure(queue, reason)  # another query, or our own previous connection's link
            if message is not None:
                error = AmqpSourceError(message)
                error.__cause__ = reason
                self._fail(error)
            return message is not None
        if not is_transient(reason):
            self._fail(self._error(reason, queue))
            return True
        log.warning("AMQP source: the broker ended the link of queue '%s' (%s); attaching again", queue, reason)
        return False

    def _ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        link = self._links.get(session)
        receiver = link.receiver if link is not None else None
        if link is None or receiver is None or receiver.closed.done():
            return
        ranges = link.up_to(multiple) if multiple is not None else []
        for tag in singles:
            link.single(tag)
            ranges.append((tag, tag))
        for first, last in ranges:
            _settle(receiver, first, last, Outcome.ACCEPTED)
        self._top_up(link, receiver)
        self._background(self._prove(link, receiver, ack_round))

    def _dead_letter(self, settlements: list[tuple[str, int, str]]) -> None:
        for session, tag, why in settlements:
            link = self._links.get(session)
            receiver = link.receiver if link is not None else None
            if link is None or receiver is None or receiver.closed.done():
                continue
            link.single(tag)
            _settle(receiver, tag, tag, Outcome.modified(True, True, {Symbol("x-opt-spark-amqp-reason"): why}))
            self._top_up(link, receiver)

    def _top_up(self, link: _Link, receiver: Receiver) -> None:
        """Credit up to what the prefetch window leaves, once at least a quarter of it is free (a flow a delivery costs)."""
        room = self.options.prefetch - link.unsettled
        if not self._paused and room - receiver.credit >= max(1, self.options.prefetch // 4):
            receiver.grant(room)

    async def _prove(self, link: _Link, receiver: Receiver, ack_round: int) -> None:
        try:
            await receiver.echo()
        except AmqpProtocolError:
            return  # the link is gone: its deliveries come back, and the ledger knows the settlement is unproven
        self.inbox.append(AckConfirmed(link.session, ack_round))

    def _attached(self) -> list[tuple[_Link, Receiver]]:
        client = self._client
        if client is None or client.closed.done():
            raise AmqpSourceError(f"not connected to {self.options.connection.display_uri} (reconnecting)")
        return [(lk, lk.receiver) for lk in self._links.values() if lk.receiver is not None and not lk.receiver.closed.done()]

    async def _pause(self) -> None:
        self._paused = True
        await asyncio.gather(*(receiver.echo(credit=0) for _, receiver in self._attached()))

    async def _resume(self) -> None:
        self._paused = False
        for link, receiver in self._attached():
            receiver.grant(max(0, self.options.prefetch - link.unsettled))

    async def _settle(self, queues: list[str]) -> bool:
        live = [(link, receiver) for link, receiver in self._attached() if link.queue in queues]
        if {link.queue for link, _ in live} != set(queues):
            return False
        try:
            await asyncio.gather(*(receiver.echo() for _, receiver in live))
        except AmqpProtocolError:
            return False
        return True

    async def _ready_counts(self) -> dict[str, int]:
        attached = self._attached()
        for _, receiver in attached:
            # Only RabbitMQ reports available; elsewhere an echo is a probe link's attach, every call, for nothing.
            if receiver.client.rabbitmq and not receiver.echoing:
                self._background(self._echo(receiver))
        counts = {link.queue: receiver.available for link, receiver in attached}
        missing = [q for q in self.options.queues if counts.get(q) is None]
        if missing:
            raise AmqpSourceError(f"{self.options.connection.display_uri} has not said yet how many messages queue '{missing[0]}' holds")
        return {q: int(counts[q] or 0) for q in self.options.queues}

    async def _echo(self, receiver: Receiver) -> None:
        try:
            await receiver.echo()
        except AmqpProtocolError:
            pass  # the link went: it is attached again, and asked again

    async def _stop(self) -> None:
        client = self._client
        if client is not None:
            # Released, not left to the link's end: RabbitMQ 4.3 counts a quorum queue's message that a closing
            # link takes back as a return towards its delivery-limit; a release it does not count.
            attached = self._attached()
            # No credit first, and the broker's word that nothing more is on its way: then every delivery is here.
            await asyncio.gather(*(receiver.echo(credit=0) for _, receiver in attached), return_exceptions=True)
            for link, receiver in attached:
                for first, last in link.up_to(link.runs[-1][1] if link.runs else -1):
                    _settle(receiver, first, last, Outcome.RELEASED)
            await client.close()
        if self._main is not None:
            self._main.cancel()


def _settle(receiver: Receiver, first: int, last: int, outcome: bytes) -> None:
    """Tags ``first`` to ``last`` as dispositions: one on each side of a wrap of the delivery ids."""
    while first >> 32 != last >> 32:
        receiver.settle(first & _ID, _ID, outcome)
        first = (first | _ID) + 1
    receiver.settle(first & _ID, last & _ID, outcome)
