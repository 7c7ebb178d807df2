"""Reading a stream range over AMQP 1.0 (``protocol=amqp1.0``, RabbitMQ 4.x): a receiver link whose source filter
``rabbitmq:stream-offset-spec`` starts it at the range's first offset; each delivery's ``x-stream-offset`` annotation
is its offset. The broker's Bloom filter (option ``filter``) is the source filters ``rabbitmq:stream-filter`` and
``rabbitmq:stream-match-unfiltered``, as the consumer arguments of those names are over AMQP 0-9-1.

Credit is topped up as deliveries come (on a stream a settlement deletes nothing, and RabbitMQ does not give credit
back for it); deliveries are settled ``accepted`` in ranges, so the broker forgets them. Rows are made as the stream
protocol's records are (``rows.RowMaker``): RabbitMQ keeps a stream's messages as AMQP 1.0 and sends them as they are.
"""

from __future__ import annotations

from typing import Any

from ..amqp10 import sections
from ..amqp10.performatives import Outcome
from ..amqp10.types import Described, Symbol
from ..amqp10_client import Amqp10Client, Receiver
from ..amqp10_client.management import queue_info
from ..errors import AmqpSourceError, ConnectionLost
from ..reading.stream_consumers import not_a_stream
from ..stream_protocol.rows import Conversion, RowMaker
from . import expression_filters
from .options import StreamSourceOptions
from .range_base import FILTER_IDLE
from .range_over_amqp import AmqpRangeReader
from .ranges import StreamRange

__all__ = ["Amqp10RangeReader"]

_OFFSET = b"x-stream-offset"
_OFFSET_KEY = b"\xa3\x0f" + _OFFSET  # the annotation's key: a symbol of 15 bytes
_WIDTHS = {0x81: 8, 0x80: 8, 0x55: 1, 0x53: 1, 0x44: 0}  # long, ulong, small long, small ulong, ulong 0: value bytes


class Amqp10RangeReader(AmqpRangeReader):
    """AMQP 0-9-1's range reader but for the link: what RabbitMQ does not deliver (a compressed sub-entry) is checked
    over the stream protocol the same way (``AmqpRangeReader``'s silences and jumps)."""

    def __init__(self, options: StreamSourceOptions, part: StreamRange) -> None:
        super().__init__(options, part)
        self.receiver: Receiver | None = None
        self.link_client: Amqp10Client | None = None  # the link's connection (self.client: AMQP 0-9-1's, for checks)
        self.window = max(1, min(options.prefetch, part.size))
        self.rows_of: RowMaker | None = None
        self._unsettled: tuple[int, int] | None = None  # (first, last) delivery ids not yet settled
        self.expression = options.expression
        self._link_heard: float | None = None  # when the link's connection, dropped to resume, last heard from its broker

    async def _connect(self) -> None:
        # The checks on jumps and silences ask over AMQP 0-9-1 (``self.client``), on the same port on RabbitMQ 4.
        await super()._connect()
        connection = self.outage.attempt_options(self.options.connection)
        link_client = await Amqp10Client.connect(connection, f"spark-amqp stream reader {self.part.stream}")
        self.link_client = link_client
        if not link_client.rabbitmq:
            product = link_client.server_properties.get("product", "this broker")
            raise AmqpSourceError(
                f"stream mode over AMQP 1.0 reads RabbitMQ streams (x-stream-offset), which {product} does not have: read a "
                "queue with option 'queue'"
            )
        conversion = Conversion.of(link_client.server_version)
        self.rows_of = RowMaker(self.part.stream, conversion, self.options.made)
        self._use_core(conversion)  # each message's row where the core can (the sections of a chunk's record)
        # A classic or quorum queue would hand its messages over (and take them back redelivered): ask first.
        kind = (await queue_info(link_client, self.part.stream)).get("type")
        if kind != "stream":
            raise not_a_stream(self.part.stream, why=f"RabbitMQ's management node gives its type: {kind}")

    async def _subscribe(self) -> None:
        client = self.link_client
        assert client is not None
        self.failure = None
        self._unsettled = None
        filters: dict[Any, Any] = {
            Symbol("rabbitmq:stream-offset-spec"): Described(Symbol("rabbitmq:stream-offset-spec"), self.next_offset)
        }
        for argument, value in self.broker_filter.items():
            name = "rabbitmq:" + argument.removeprefix("x-")  # x-stream-filter, x-stream-match-unfiltered
            filters[Symbol(name)] = Described(Symbol(name), value)
        filters.update(self.expression.source_filters())
        receiver = self.receiver = await client.receiver(client.queue_address(self.part.stream), self._on_transfer, filters)
        receiver.closed.add_done_callback(self._on_closed)
        if self.expression:
            refusal = expression_filters.refused(
                self.expression, receiver.attached.result(), self.options.connection, client.server_version
            )
            if refusal is not None:
                raise refusal
        self.subscribed = True
        receiver.grant(self.window)

    async def _unsubscribe(self) -> None:
        receiver, self.receiver, self.subscribed = self.receiver, None, False
        if receiver is not None and not receiver.closed.done():
            self._settle(receiver)
            await receiver.detach()

    async def close(self) -> None:
        self.receiver = None
        link_client, self.link_client = self.link_client, None
        if link_client is not None:
            await link_client.close()
        await super().close()

    async def _resume(self, err: BaseException) -> None:
        self.receiver = None
        link_client, self.link_client = self.link_client, None
        self._link_heard = None if link_client is None else link_client.last_heard
        if link_client is not None:
            link_client.abort(ConnectionLost("resuming"))
        await super()._resume(err)

    def _heard(self) -> float | None:
        heard = [h for h in (super()._heard(), self._link_heard) if h is not None]
        return max(heard) if heard else None

    def _on_closed(self, closed: Any) -> None:
        reason = closed.result()
        if reason is not None and self.failure is None and not self.done:
            self.failure = reason
            self.arrived.set()

    def _settle(self, receiver: Receiver) -> None:
        if self._unsettled is not None:
            receiver.settle(*self._unsettled, Outcome.ACCEPTED)
            self._unsettled = None

    # With filter expressions, the offsets that do not match never come: a range ends when a drain says the stream has
    # nothing more (see expression_filters). Jumps are what the filter left out; retention is still checked on them.

    @property
    def _may_widen(self) -> bool:
        return not self.expression and super()._may_widen

    def _patience(self, timeout: float) -> float:
        return FILTER_IDLE if self.expression else super()._patience(timeout)

    async def _silent_a_while(self) -> bool:
        receiver = self.receiver
        if not self.expression or receiver is None:
            return await super()._silent_a_while()
        if await receiver.drain():
            last = await self.access.tail(self.client, self.part.stream)
            if (0 if last is None else last[0] + 1) < self.part.end:
                return False  # the stream is shorter than when this range was planned: _silent says why
            self.done = True
        elif not self.full:
            self._refill()
        self.arrived.set()
        return True

    async def _unseen(self, start: int, stop: int) -> None:
        if not self.expression:  # else what the filter left out (and a compressed sub-entry cannot be told from it)
            await super()._unseen(start, stop)

    def _refill(self) -> None:
        receiver = self.receiver
        if receiver is not None and receiver.credit * 2 < self.window and not receiver.closed.done():
            self._settle(receiver)
            receiver.grant(self.window)

    def _on_transfer(self, delivery_id: int, message: bytes) -> None:
        receiver = self.receiver
        if self.done or self.failure is not None or receiver is None:
            return
        first = delivery_id if self._unsettled is None or delivery_id < self._unsettled[0] else self._unsettled[0]
        self._unsettled = (first, delivery_id)
        if not self.full:
            self._refill()
        offset, message = _stream_offset(message)
        if offset is None:
            self.failure = AmqpSourceError(f"'{self.part.stream}' sent a message without x-stream-offset: it is not a stream")
            self.arrived.set()
            return
        assert self.rows_of is not None
        if self._offered(offset) and self.rows.add_message(message, offset) is None:
            row = self.rows_of.row(message, offset)
            if self.row_filter is None or self.row_filter.keeps(row[5]):
                self.rows.append(row)
        self.arrived.set()


def _stream_offset(message: bytes) -> tuple[int | None, bytes]:
    """The ``x-stream-offset`` annotation RabbitMQ puts on each delivery from a stream, and the message with that
    annotation's value zeroed: the sections before the body are then the same from message to message (as they are
    read over the stream protocol), and ``RowMaker`` decodes them once. Read where it stands when it is a long or a
    ulong of any width; another encoding by decoding the sections (the message as it is)."""
    at = message.find(_OFFSET_KEY, 0, 1024)
    if at >= 0:
        at += len(_OFFSET_KEY)
        kind = message[at]
        width = _WIDTHS.get(kind)
        if width is not None:
            value = int.from_bytes(message[at + 1 : at + 1 + width], "big", signed=kind in (0x81, 0x55))
            return value, message[: at + 1] + bytes(width) + message[at + 1 + width :]
    if _OFFSET not in message[:1024]:
        return None, message
    found = sections(message).annotations.get("x-stream-offset")
    return (found if isinstance(found, int) else None), message
