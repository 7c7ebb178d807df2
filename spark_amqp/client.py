"""A small asyncio AMQP 0-9-1 consumer client: what the source needs and nothing more.

pika decodes every frame into objects and every message's properties into a
``BasicProperties``; at tens of thousands of messages a second that is most of
the source runner's CPU. Here one protocol object owns the socket (as in
aiormq), pamqp encodes and decodes the control methods, and the three frames of
a delivery are sliced with ``struct``. Properties stay encoded until a batch
is built (``LazyProperties``), and most messages carry few or none.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands

from .broker import codec
from .connection import tls_context
from .options import ConnectionOptions

__all__ = ["AmqpClient", "ClientChannel", "ConnectionLost", "LazyProperties", "LoginRefused", "ServerClosedChannel"]

_DELIVER = struct.pack(">HH", 60, 60)
_RETURN = struct.pack(">HH", 60, 50)
_PUBLISH = struct.pack(">HHH", 60, 40, 0)
_BROKER_ACK = struct.pack(">HH", 60, 80)
_BROKER_NACK = struct.pack(">HH", 60, 120)
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
B = commands.Basic


class ConnectionLost(Exception):
    def __init__(self, reason: str, code: int = 0) -> None:
        super().__init__(reason)
        self.code = code


class LoginRefused(ConnectionLost):
    pass


class ServerClosedChannel(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class LazyProperties:
    """Message properties under pika's attribute names, decoded on first use."""

    __slots__ = ("_decoded", "_raw")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw  # the content header payload from byte 12 (flags onward)
        self._decoded: Any = None

    def _props(self) -> Any:
        props = self._decoded
        if props is None:
            props = commands.Basic.Properties.__new__(commands.Basic.Properties)
            for name in props.__slots__:
                setattr(props, name, None)
            flags = _U16.unpack_from(self._raw, 0)[0]
            if flags:
                props.unmarshal(flags, self._raw[2:])
            self._decoded = props
        return props

    def arrow_row(self) -> tuple[Any, ...]:
        """The values of ``arrow.PROPERTY_FIELDS`` in order; a message without properties costs nothing."""
        if self._raw[0:2] == b"\x00\x00":
            return _NO_PROPERTIES
        p = self._props()
        return (
            p.message_id,
            p.correlation_id,
            p.content_type,
            p.content_encoding,
            p.message_type,
            p.app_id,
            p.user_id,
            p.reply_to,
            p.expiration,
            p.priority,
            p.delivery_mode,
            self.timestamp,
            p.headers,
        )

    def __getattr__(self, name: str) -> Any:
        if name == "type":
            return self._props().message_type
        if name == "timestamp":
            value = self._props().timestamp
            if isinstance(value, datetime.datetime):
                if value.tzinfo is None:
                    value = value.replace(tzinfo=datetime.timezone.utc)
                return int(value.timestamp())
            return value
        if name in commands.Basic.Properties.__slots__:
            if self._raw[0:2] == b"\x00\x00":
                return None
            return getattr(self._props(), name)
        raise AttributeError(name)


_NO_PROPERTIES = (None,) * 13

DeliveryCallback = Callable[[int, bool, str, str, LazyProperties, bytes], None]


class ClientChannel:
    def __init__(self, client: AmqpClient, number: int) -> None:
        self.client = client
        self.number = number
        self.closed: asyncio.Future[ServerClosedChannel | ConnectionLost | None] = client.loop.create_future()
        self.on_delivery: DeliveryCallback | None = None
        self.on_cancel: Callable[[str], None] | None = None
        # publisher side: confirms (tag, multiple, ack) and returns (code, text, exchange, routing key)
        self.on_confirm: Callable[[int, bool, bool], None] | None = None
        self.on_return: Callable[[int, str, str, str], None] | None = None
        self._returning: tuple[int, str, str, str] | None = None
        self._rpc: asyncio.Future[Any] | None = None
        self._rpc_lock = asyncio.Lock()
        # a delivery being assembled
        self._pending: tuple[int, bool, str, str] | None = None
        self._props: LazyProperties | None = None
        self._size = 0
        self._received = 0
        self._parts: list[bytes] = []

    @property
    def is_open(self) -> bool:
        return not self.closed.done()

    async def rpc(self, method: Any) -> Any:
        async with self._rpc_lock:
            if self.closed.done():
                raise self._closed_error()
            future: asyncio.Future[Any] = self.client.loop.create_future()
            self._rpc = future
            self.client.send_method(self.number, method)
            try:
                return await future
            finally:
                self._rpc = None

    def _closed_error(self) -> Exception:
        reason = self.closed.result() if self.closed.done() else None
        return reason if reason is not None else ConnectionLost("channel closed")

    def ack(self, tag: int, multiple: bool) -> None:
        if self.is_open:
            self.client.write(codec.confirm_method(self.number, tag, multiple, True))

    async def close(self) -> None:
        if self.is_open:
            try:
                await asyncio.wait_for(self.rpc(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)), 5)
            except (asyncio.TimeoutError, ServerClosedChannel, ConnectionLost):
                pass
            self._finish(None)

    def _finish(self, reason: ServerClosedChannel | ConnectionLost | None) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        if self._rpc is not None and not self._rpc.done():
            self._rpc.set_exception(reason or ConnectionLost("channel closed"))
        self.client.channels.pop(self.number, None)

    # -- frames from the reader -------------------------------------------------

    def publish(self, exchange: bytes, routing_key: bytes, mandatory: bool, header_payload: bytes, body: bytes) -> None:
        """basic.publish with pre-encoded shortstr exchange/key and content header payload."""
        client = self.client
        number = self.number
        method = b"".join((_PUBLISH, exchange, routing_key, b"\x01" if mandatory else b"\x00"))
        frames = [codec.frame(codec.FRAME_METHOD, number, method)]
        frames.extend(codec.content_frames(number, header_payload, body, client.frame_max))
        client.write(b"".join(frames))

    def on_method(self, payload: bytes) -> None:
        head = payload[:4]
        if head in (_BROKER_ACK, _BROKER_NACK):
            if self.on_confirm is not None:
                tag = _U64.unpack_from(payload, 4)[0]
                self.on_confirm(tag, bool(payload[12] & 1), head == _BROKER_ACK)
            return
        if head == _RETURN:
            ret: Any = codec.decode_method(payload)
            self._returning = (ret.reply_code or 0, ret.reply_text or "", ret.exchange or "", ret.routing_key or "")
            self._pending = None
            return
        if head == _DELIVER:
            # consumer tag, delivery tag, redelivered, exchange, routing key
            offset = 4 + 1 + payload[4]
            tag = _U64.unpack_from(payload, offset)[0]
            redelivered = bool(payload[offset + 8] & 1)
            offset += 9
            xlen = payload[offset]
            exchange = payload[offset + 1 : offset + 1 + xlen].decode("utf-8")
            offset += 1 + xlen
            rlen = payload[offset]
            routing_key = payload[offset + 1 : offset + 1 + rlen].decode("utf-8")
            self._pending = (tag, redelivered, exchange, routing_key)
            return
        method = codec.decode_method(payload)
        if isinstance(method, commands.Channel.Close):
            self.client.send_method(self.number, commands.Channel.CloseOk())
            self._finish(ServerClosedChannel(method.reply_code or 0, method.reply_text or ""))
        elif isinstance(method, B.Cancel):
            if self.on_cancel is not None:
                self.on_cancel(method.consumer_tag or "")
        elif self._rpc is not None and not self._rpc.done():  # the reply to the pending rpc
            self._rpc.set_result(method)

    def on_header(self, payload: bytes) -> None:
        self._size = _U64.unpack_from(payload, 4)[0]
        self._props = LazyProperties(payload[12:])
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


class AmqpClient(asyncio.Protocol):
    """One connection; deliveries are handed to channel callbacks from ``data_received``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: ConnectionOptions, client_name: str) -> None:
        self.loop = loop
        self.options = options
        self.client_name = client_name
        self.transport: asyncio.Transport | None = None
        self.channels: dict[int, ClientChannel] = {}
        self.closed: asyncio.Future[ConnectionLost] = loop.create_future()
        self.frame_max = 131072
        self.heartbeat = 0
        self._buffer = bytearray()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._next_channel = 1
        self._last_recv = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    async def connect(cls, options: ConnectionOptions, client_name: str) -> AmqpClient:
        loop = asyncio.get_running_loop()
        ctx = tls_context(options)
        timeout = options.connection_timeout
        _, client = await asyncio.wait_for(
            loop.create_connection(
                lambda: cls(loop, options, client_name), options.host, options.port, ssl=ctx, server_hostname=options.host if ctx else None
            ),
            timeout,
        )
        await asyncio.wait_for(asyncio.shield(client._opened), timeout)
        return client

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._last_recv = self.loop.time()
        transport.write(codec.PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(ConnectionLost(f"socket closed: {exc}" if exc else "socket closed by the broker"))

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        buf = self._buffer
        buf += data
        if not self._opened.done() and buf[:4] == b"AMQP":
            self._lost(ConnectionLost(f"the broker does not speak AMQP 0-9-1 (it answered {bytes(buf[:8])!r})"))
            return
        offset = 0
        head = codec.FRAME_HEAD
        try:
            while len(buf) - offset >= 8:
                ftype, channel, size = head.unpack_from(buf, offset)
                end = offset + 7 + size
                if len(buf) <= end:
                    break
                payload = bytes(buf[offset + 7 : end])
                offset = end + 1
                if channel == 0:
                    if ftype == 1:
                        self._on_connection_method(codec.decode_method(payload))
                    continue
                ch = self.channels.get(channel)
                if ch is None:
                    continue
                if ftype == 1:
                    ch.on_method(payload)
                elif ftype == 2:
                    ch.on_header(payload)
                elif ftype == 3:
                    ch.on_body(payload)
        except codec.DecodeError as err:
            self._lost(ConnectionLost(f"undecodable frame from the broker: {err}"))
        finally:
            del buf[:offset]

    # -- connection class -------------------------------------------------------------

    def _on_connection_method(self, method: Any) -> None:
        C = commands.Connection
        if isinstance(method, C.Start):
            props: dict[str, Any] = {
                "product": "spark-amqp",
                "connection_name": self.client_name,
                "capabilities": {
                    "authentication_failure_close": True,
                    "consumer_cancel_notify": True,
                    "basic.nack": True,
                    "publisher_confirms": True,
                },
            }
            response = f"\0{self.options.username}\0{self.options.password}"
            self.send_method(0, C.StartOk(client_properties=props, mechanism="PLAIN", response=response, locale="en_US"))
        elif isinstance(method, C.Tune):
            self.frame_max = min(method.frame_max or 131072, 131072)
            self.heartbeat = min(self.options.heartbeat, method.heartbeat) if method.heartbeat else self.options.heartbeat
            channel_max = method.channel_max or 2047
            self.send_method(0, C.TuneOk(channel_max=channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat))
            self.send_method(0, C.Open(virtual_host=self.options.vhost))
            if self.heartbeat:
                self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat)
        elif isinstance(method, C.OpenOk):
            if not self._opened.done():
                self._opened.set_result(None)
        elif isinstance(method, C.Close):
            self.send_method(0, C.CloseOk())
            code = method.reply_code or 0
            error_cls = LoginRefused if code == 403 and not self._opened.done() else ConnectionLost
            self._lost(error_cls(f"{code} {method.reply_text}", code))
        elif isinstance(method, C.CloseOk):
            self._lost(ConnectionLost("closed"))
        elif isinstance(method, C.Blocked | C.Unblocked):
            pass

    def _heartbeat(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.loop.time() - self._last_recv > 2 * self.heartbeat:
            self.transport.abort()
            self._lost(ConnectionLost(f"missed heartbeats from the broker ({self.heartbeat}s)"))
            return
        self.write(codec.HEARTBEAT_FRAME)
        self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat)

    def _lost(self, reason: ConnectionLost) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._opened.done():
            self._opened.set_exception(reason)
            self._opened.exception()  # retrieved: connect() reports it
        if not self.closed.done():
            self.closed.set_result(reason)
        for ch in list(self.channels.values()):
            ch._finish(reason)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- API ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.write(codec.method_frame(channel, method))

    async def channel(self) -> ClientChannel:
        if self.closed.done():
            raise self.closed.result()
        number = self._next_channel
        self._next_channel = number % 2047 + 1
        while number in self.channels:
            number = self._next_channel
            self._next_channel = number % 2047 + 1
        ch = ClientChannel(self, number)
        self.channels[number] = ch
        await ch.rpc(commands.Channel.Open())
        return ch

    async def close(self) -> None:
        if self.closed.done():
            return
        self.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), 5)
        except asyncio.TimeoutError:
            self._lost(ConnectionLost("closed"))


async def queue_depths(options: ConnectionOptions, queues: list[str] | tuple[str, ...], client_name: str) -> dict[str, int]:
    """Ready messages per queue, from passive declares on a short-lived connection."""
    client = await AmqpClient.connect(options, client_name)
    try:
        depths = {}
        for queue in queues:
            channel = await client.channel()
            ok = await channel.rpc(commands.Queue.Declare(queue=queue, passive=True))
            depths[queue] = int(ok.message_count or 0)
            await channel.close()
        return depths
    finally:
        await client.close()
