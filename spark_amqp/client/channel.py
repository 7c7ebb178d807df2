"""``ClientChannel``: one AMQP channel of an ``AmqpClient``.

Synchronous methods go through ``rpc``, one at a time and each with a
timeout. Frames arrive from the connection's reader: replies resolve the
pending call, a ``channel.close`` from the broker ends the channel with the
reply's exception (``errors.reply_error``), and content is assembled into
deliveries (``consumer``) or returns (``publisher``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from .. import framing
from ..errors import AmqpProtocolError, ConnectionLost, reply_error
from . import consumer, publisher
from .properties import LazyProperties

if TYPE_CHECKING:
    from .connection import AmqpClient

__all__ = ["ClientChannel", "DeliveryCallback"]

DeliveryCallback = Callable[[int, bool, str, str, LazyProperties, bytes], None]


class ClientChannel:
    def __init__(self, client: AmqpClient, number: int) -> None:
        self.client = client
        self.number = number
        # None: closed by us; otherwise why the broker or the connection ended it
        self.closed: asyncio.Future[AmqpProtocolError | None] = client.loop.create_future()
        self.on_delivery: DeliveryCallback | None = None
        self.on_cancel: Callable[[str], None] | None = None
        # publisher side: confirms (tag, multiple, ack) and returns (code, text, exchange, routing key)
        self.on_confirm: Callable[[int, bool, bool], None] | None = None
        self.on_return: Callable[[int, str, str, str], None] | None = None
        self._returning: tuple[int, str, str, str] | None = None
        self._rpc: asyncio.Future[Any] | None = None
        self._rpc_lock = asyncio.Lock()
        self._closing = False
        # a delivery being assembled
        self._pending: tuple[int, bool, str, str] | None = None
        self._props: LazyProperties | None = None
        self._size = 0
        self._received = 0
        self._parts: list[bytes] = []

    @property
    def is_open(self) -> bool:
        # Once we sent channel.close, nothing more may go out on this channel:
        # the broker answers a frame after it with a 504 connection error.
        return not self._closing and not self.closed.done()

    async def rpc(self, method: Any, timeout: float | None = None) -> Any:
        """Send a synchronous method and wait for its reply, at most ``timeout`` (default: connectionTimeout)."""
        limit = self.client.options.connection_timeout if timeout is None else timeout
        async with self._rpc_lock:
            if self.closed.done() or (self._closing and not isinstance(method, commands.Channel.Close)):
                raise self._closed_error()
            future: asyncio.Future[Any] = self.client.loop.create_future()
            self._rpc = future
            self.client.send_method(self.number, method)
            try:
                return await asyncio.wait_for(future, limit)
            except TimeoutError:
                # A broker that stops answering on one channel is not trusted with the next call either. A query over
                # AMQP 1.0 asks some questions here too (stream mode's planning): its user knows no 0-9-1 method.
                what = "" if self.client.options.amqp10 else f" {method.name}"
                err = ConnectionLost(f"the broker did not answer{what} within {limit:g}s")
                self.client.abort(err)
                raise err from None
            finally:
                self._rpc = None

    def _closed_error(self) -> AmqpProtocolError:
        reason = self.closed.result() if self.closed.done() else None
        return reason if reason is not None else ConnectionLost("channel closed")

    def ack(self, tag: int, multiple: bool) -> None:
        if self.is_open:
            self.client.write(framing.confirm_method(self.number, tag, multiple, True))

    async def give_back(self, consumer_tag: str) -> None:
        """Stop the consumer, then return every unacknowledged delivery with a requeueing nack.

        RabbitMQ 4.3 counts a closed channel as a return towards a quorum queue's delivery-limit,
        but not a nack. The consumer goes first, or the nacked messages would be sent to it again
        (and returned again, counted, when the channel closes)."""
        if not self.is_open:
            return
        await self.rpc(commands.Basic.Cancel(consumer_tag=consumer_tag), timeout=min(5.0, self.client.options.connection_timeout))
        self.client.write(framing.confirm_method(self.number, 0, True, False, requeue=True))

    def publish(self, exchange: bytes, routing_key: bytes, mandatory: bool, header_payload: bytes, body: bytes) -> None:
        """basic.publish with pre-encoded shortstr exchange/key and content header payload."""
        self.client.write(
            publisher.publish_frames(self.number, exchange, routing_key, mandatory, header_payload, body, self.client.frame_max)
        )

    async def close(self) -> None:
        if self.is_open:
            self._closing = True
            try:
                await self.rpc(framing.build(commands.Channel.Close, reply_code=200, reply_text="bye"), timeout=5)
            except AmqpProtocolError:
                pass  # closing anyway: the channel is gone either way
            self._finish(None)

    def _finish(self, reason: AmqpProtocolError | None) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        if self._rpc is not None and not self._rpc.done():
            self._rpc.set_exception(reason or ConnectionLost("channel closed"))
        self.client.channels.pop(self.number, None)

    # -- frames from the reader -------------------------------------------------

    def on_method(self, payload: bytes) -> None:
        head = payload[:4]
        if head in publisher.CONFIRMS:
            if self.on_confirm is not None:
                self.on_confirm(*publisher.parse_confirm(payload))
            return
        if head == publisher.RETURN:
            self._returning = publisher.parse_return(payload)
            self._pending = None
            return
        if head == consumer.DELIVER:
            self._pending = consumer.parse_deliver(payload)
            return
        method = framing.decode_method(payload)
        if isinstance(method, commands.Channel.Close):
            self.client.send_method(self.number, commands.Channel.CloseOk())
            self._finish(reply_error(method.reply_code or 0, method.reply_text or "", method.class_id or 0, method.method_id or 0))
        elif isinstance(method, commands.Basic.Cancel):
            if self.on_cancel is not None:
                self.on_cancel(method.consumer_tag or "")
        elif self._rpc is not None and not self._rpc.done():  # the reply to the pending rpc
            self._rpc.set_result(method)

    @property
    def idle(self) -> bool:
        """No content is being assembled: a delivery may arrive whole."""
        return self._pending is None and self._returning is None and self._props is None

    def deliver(self, deliver: tuple[int, bool, str, str], header: bytes, body: bytes) -> None:
        """A delivery whose frames all arrived together (``consumer.whole_delivery``)."""
        if self.on_delivery is not None:
            self.on_delivery(deliver[0], deliver[1], deliver[2], deliver[3], LazyProperties(header), body)

    def on_header(self, payload: bytes) -> None:
        self._size = consumer.body_size(payload)
        self._props = LazyProperties(payload)
        self._parts = []
        self._received = 0
        if self._size == 0:
            self._complete(b"")

    def on_body(self, payload: bytes) -> None:
        self._parts.append(payload)
        self._received += len(payload)
        if self._received >= self._size:
            self._complete(self._parts[0] if len(self._parts) == 1 else b"".join(self._parts))

    def _complete(self, body: bytes) -> None:
        if self._returning is not None:
            returned, self._returning = self._returning, None
            self._props, self._parts = None, []
            if self.on_return is not None:
                self.on_return(*returned)
            return
        pending, props = self._pending, self._props
        self._pending, self._props, self._parts = None, None, []
        if pending is not None and props is not None and self.on_delivery is not None:
            self.on_delivery(pending[0], pending[1], pending[2], pending[3], props, body)
