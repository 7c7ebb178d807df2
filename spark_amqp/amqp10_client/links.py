"""An AMQP 1.0 link's end in this client: a ``Receiver`` reads a source with credit; a ``Sender`` writes to a target.

Every delivery is unsettled: a receiver settles ranges of delivery ids with one outcome (``settle``), as a
multi-ack does over AMQP 0-9-1; a sender learns each message's outcome from the broker's dispositions. A link
ends with ``closed`` set to why: the broker's detach error, or the connection's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..amqp10 import performatives as p
from ..errors import AmqpProtocolError

if TYPE_CHECKING:
    from .connection import Amqp10Client

__all__ = ["DeliveryHandler", "Link", "Receiver", "Sender"]

T = TypeVar("T")

_SERIAL = 0xFFFFFFFF


def _serial_diff(a: int, b: int) -> int:
    """``a - b`` for serial numbers (RFC 1982, 32 bits): negative when ``a`` is behind."""
    return ((a - b + (1 << 31)) & _SERIAL) - (1 << 31)


# A transfer frame's own bytes, at most: the frame header and the performative (handle, id, tag, flags).
TRANSFER_OVERHEAD = 64

# delivery id, message bytes (the sections), whether the broker already settled it
DeliveryHandler = Callable[[int, bytes], None]
# delivery ids, then the outcome's descriptor code and its fields
OutcomeHandler = Callable[[int, int, int, list[Any]], None]


def serial_ids(first: int, last: int) -> range | list[int]:
    """Delivery ids ``first`` to ``last``, which are serial numbers: a range may run past 2**32 - 1 to 0 and on."""
    if first <= last:
        return range(first, last + 1)
    return [*range(first, 1 << 32), *range(last + 1)]


class Link:
    def __init__(self, client: Amqp10Client, handle: int, name: str, address: str) -> None:
        self.client = client
        self.handle = handle
        self.name = name
        self.address = address
        self.attached: asyncio.Future[list[Any]] = client.loop.create_future()  # the broker's attach's fields
        self.closed: asyncio.Future[AmqpProtocolError | None] = client.loop.create_future()
        self.delivery_count = 0
        self.credit = 0
        self.detaching = False  # this client asked to end it (the broker's detach is then the answer)

    def _end(self, reason: AmqpProtocolError | None) -> None:
        if not self.attached.done():
            if reason is None:
                self.attached.cancel()
            else:
                self.attached.set_exception(reason)
                self.attached.exception()
        if not self.closed.done():
            self.closed.set_result(reason)

    async def detach(self) -> None:
        """Ends the link; deliveries it holds unsettled go back to the queue."""
        if self.closed.done():
            return
        self.detaching = True
        self.client.write(p.detach(self.handle))
        await asyncio.wait_for(asyncio.shield(self.closed), self.client.options.connection_timeout)


class Receiver(Link):
    """Deliveries go to ``on_delivery`` as they come, a message whole (its transfers joined)."""

    def __init__(self, client: Amqp10Client, handle: int, name: str, address: str, on_delivery: DeliveryHandler) -> None:
        super().__init__(client, handle, name, address)
        self.on_delivery = on_delivery
        self._partial: list[bytes] = []
        self.available: int | None = None  # what the source holds beyond this link's credit, as the broker last said
        self._echoes: list[asyncio.Future[int | None]] = []
        self._limit: int | None = None  # no grant yet: no credit
        self._drains: list[asyncio.Future[bool]] = []

    @property
    def echoing(self) -> bool:
        """An echo is waiting for the broker's answer."""
        return any(not w.done() for w in self._echoes)

    def grant(self, credit: int, drain: bool = False, echo: bool = False) -> None:
        """Sets the link's credit to ``credit`` (AMQP 1.0 credit is set, not added)."""
        self.credit = credit
        self._limit = (self.delivery_count + credit) & _SERIAL  # the delivery-count the broker may send up to
        self.client.flow(self, credit, drain, echo)

    async def echo(self, credit: int | None = None) -> int | None:
        """Sets the link's credit (to ``credit``, else its own) and waits for the broker's answer: every frame sent
        before is then processed (a broker handles a session's frames in order), and every transfer it sent before
        has arrived. Returns the ``available`` its flow reports (None where it reports none).

        RabbitMQ answers a flow's ``echo``. ActiveMQ Artemis ignores it, and answers a ``drain`` only when credit is
        left over: there the answer is to attaching (and detaching) a link to the same address, without credit."""
        credit = self.credit if credit is None else credit
        if not self.client.rabbitmq:
            self.grant(credit)
            probe = await self.client.receiver(self.address, lambda delivery_id, message: None)
            await probe.detach()
            return None
        waiter: asyncio.Future[int | None] = self.client.loop.create_future()
        self._echoes.append(waiter)
        self.grant(credit, echo=True)
        return await self._answer(waiter, "a flow")

    async def drain(self) -> bool:
        """Asks the broker to use the link's credit up now, and waits for its answer: whether it ran out of messages
        (it then advanced delivery-count over the credit left). RabbitMQ answers a stream link's drain once it has read
        to the stream's end, or used the credit up."""
        waiter: asyncio.Future[bool] = self.client.loop.create_future()
        self._drains.append(waiter)
        self.client.flow(self, self.credit, True)
        return await self._answer(waiter, "a drain")

    async def _answer(self, waiter: asyncio.Future[T], what: str) -> T:
        """The broker's flow that ``waiter`` waits for; the link's end, or no answer within connectionTimeout, raises."""
        done, _ = await asyncio.wait(
            (waiter, self.closed), timeout=self.client.options.connection_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter in done:
            return waiter.result()
        waiter.cancel()
        if self.closed.done():
            raise self.closed.result() or AmqpProtocolError(f"the link to '{self.address}' ended")
        raise AmqpProtocolError(f"no answer to {what} on '{self.address}' within connectionTimeout")

    def _flow(self, delivery_count: int | None, credit: int, available: int | None) -> None:
        # The credit left is what the last grant allows past the broker's delivery-count, not the flow's link-credit:
        # a flow answering an echo sent before the last grant carries the credit of the grant before it.
        ran_out = False
        if delivery_count is not None:
            advanced = _serial_diff(delivery_count, self.delivery_count)
            if advanced > 0:  # credit the broker used up without sending: a drain that found nothing more
                self.delivery_count, ran_out = delivery_count, True
            self.credit = 0 if self._limit is None else max(0, _serial_diff(self._limit, self.delivery_count))
        elif credit == 0:
            self.credit = 0
        if credit == 0:
            drains, self._drains = self._drains, []
            for drained in drains:
                if not drained.done():
                    drained.set_result(ran_out)
        self.available = available
        echoes, self._echoes = self._echoes, []
        for waiter in echoes:
            if not waiter.done():
                waiter.set_result(available)

    def settle(self, first: int, last: int, outcome: bytes = p.Outcome.ACCEPTED) -> None:
        """One disposition for delivery ids ``first`` to ``last``: ``Outcome.ACCEPTED`` (done), ``RELEASED`` (back to
        the queue), a rejection or a modification."""
        self.client.write(p.disposition(first, last, outcome))

    def _transfer(self, delivery_id: int | None, more: bool, payload: bytes) -> None:
        if more:
            self._partial.append(payload)
            if delivery_id is not None:
                self._first_id = delivery_id
            return
        if self._partial:
            payload = b"".join([*self._partial, payload])
            self._partial = []
            delivery_id = self._first_id
        assert delivery_id is not None
        self.delivery_count = (self.delivery_count + 1) & _SERIAL  # a serial number: it wraps
        self.credit -= 1
        self.on_delivery(delivery_id, payload)


class Sender(Link):
    """Messages go out while the broker gives credit; ``on_outcome`` hears each disposition."""

    def __init__(
        self, client: Amqp10Client, handle: int, name: str, address: str, on_outcome: OutcomeHandler, settled: bool = False
    ) -> None:
        super().__init__(client, handle, name, address)
        self.on_outcome = on_outcome
        self.settled = settled  # messages go settled: no outcome comes
        self.credit_changed = asyncio.Event()
        self.granted = 0  # the most credit the broker has given at once (RabbitMQ: its max_link_credit, 170)

    def send(self, payload: bytes) -> int:
        """Transfers one message (its encoded sections); its delivery id. The caller waits for credit first."""
        delivery_id = self.client.next_delivery_id()
        room = self.client.max_frame - TRANSFER_OVERHEAD
        if not self.settled:
            self.client.track(delivery_id, self)
            if len(payload) <= room and self.handle < 256:  # what a sink sends, message after message
                self.client.write(p.usual_transfer(self.handle, delivery_id, payload))
                self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
                self.credit -= 1
                return delivery_id
        tag = delivery_id.to_bytes(4, "big")
        if len(payload) <= room:
            self.client.write(p.transfer(self.handle, delivery_id, tag, payload, self.settled))
        else:  # a message larger than a frame: transfers with more=true, then the last
            for at in range(0, len(payload), room):
                more = at + room < len(payload)
                self.client.write(p.transfer(self.handle, delivery_id, tag, payload[at : at + room], self.settled, more))
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        self.credit -= 1
        return delivery_id

    def send_run(self, payloads: list[bytes]) -> int:
        """Transfers ``payloads`` (at most the credit) in one write; the first's delivery id, the rest following it.
        A sink's usual run costs one socket write rather than one per message."""
        client = self.client
        first = client._next_delivery
        room = client.max_frame - TRANSFER_OVERHEAD
        usual = not self.settled and self.handle < 256 and first + len(payloads) <= 0xFFFFFFFF
        if not usual or not payloads or max(map(len, payloads)) > room:
            for payload in payloads:
                self.send(payload)
            return first
        handle, transfer = self.handle, p.usual_transfer
        client.write(b"".join([transfer(handle, delivery_id, payload) for delivery_id, payload in enumerate(payloads, first)]))
        client.advance_delivery_ids(len(payloads), self)
        self.delivery_count = (self.delivery_count + len(payloads)) & 0xFFFFFFFF
        self.credit -= len(payloads)
        return first

    def _flow(self, delivery_count: int | None, credit: int) -> None:
        # The receiver's view: what it has taken (delivery-count) plus credit is how far this sender may go.
        taken = self.delivery_count if delivery_count is None else delivery_count
        self.credit = ((taken + credit - self.delivery_count + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        self.granted = max(self.granted, credit)
        self.credit_changed.set()
