"""One client connection: framing, handshake, heartbeats and channel dispatch.

The protocol object owns the socket. Frames it writes are gathered in a list
and flushed once per event-loop pass, so a burst of deliveries or confirms
costs one ``transport.write``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from spark_amqp import errors, framing

from . import handshake
from .channel import Channel
from .handshake import SERVER_FRAME_MAX, HandshakeMethods

if TYPE_CHECKING:
    from .server import BrokerServer

log = logging.getLogger("spark_amqp_broker")

C = commands.Connection
CLOSE_OK_TIMEOUT = 2.0


AMQP_1_0_SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_1_0_HEADER = b"AMQP\x00\x01\x00\x00"


class BrokerConnection(HandshakeMethods, asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = "header"  # header -> start -> tune -> open -> running -> closing -> closed
        self.frame_max = SERVER_FRAME_MAX
        self.channel_max = handshake.SERVER_CHANNEL_MAX
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] = set()
        self.capabilities: dict[str, Any] = {}
        self.user = ""
        self.client_name = ""
        self.ended = ""  # how the connection ended, for tests: "closed by client" or lost
        self.write_paused = False
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._last_recv = 0.0
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self.peer = ""

    # -- asyncio.Protocol -------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._last_recv = self.loop.time()
        self.server.connections.add(self)
        # A client that never sends its header must not hold a socket forever.
        self._heartbeat_timer = self.loop.call_later(10.0, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self.state == "closed":
            return
        self.buffer += data
        try:
            self._process()
        except errors.AmqpReplyError as err:
            self.close_with(err)
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("embedded broker: internal error on connection %s", self.peer)
            self.close_with(errors.InternalError("internal error"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for channel in list(self.channels.values()):
            for consumer in list(channel.consumers.values()):
                consumer.queue.dispatch()

    # -- framing ------------------------------------------------------------

    def _process(self) -> None:
        buf = self.buffer
        if self.state == "header":
            if len(buf) < 8:
                if not framing.PROTOCOL_HEADER.startswith(bytes(buf[:8])):
                    self._reject_header()
                return
            if bytes(buf[:8]) in (AMQP_1_0_SASL_HEADER, AMQP_1_0_HEADER):
                self._to_amqp10()
                return
            if bytes(buf[:8]) != framing.PROTOCOL_HEADER:
                self._reject_header()
                return
            del buf[:8]
            self._send_start()
        offset = 0
        size_limit = self.frame_max - framing.FRAME_OVERHEAD
        head = framing.FRAME_HEAD
        try:
            while len(buf) - offset >= 8 and self.state != "closed":
                frame_type, channel, size = head.unpack_from(buf, offset)
                if size > size_limit:
                    raise errors.FrameError(f"type {frame_type}, all octets = <<>>: {{frame_too_large,{size},{size_limit}}}")
                end = offset + 7 + size
                if len(buf) <= end:
                    break
                if buf[end] != framing.FRAME_END:
                    raise errors.FrameError(f"type {frame_type}: {{invalid_frame_end_marker,{buf[end]}}}")
                payload = bytes(buf[offset + 7 : end])
                offset = end + 1
                self._on_frame(frame_type, channel, payload)
        finally:
            del buf[:offset]

    def _to_amqp10(self) -> None:
        """An AMQP 1.0 header: RabbitMQ 4.x serves AMQP 1.0 on the same port (``amqp10_connection``)."""
        from .amqp10_connection import Amqp10Connection

        assert self.transport is not None
        data = bytes(self.buffer)
        self.buffer = bytearray()
        self.state = "closed"
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        self.server.connections.discard(self)  # never counted as an AMQP 0-9-1 connection, nor as one that ended
        Amqp10Connection(self.server).take_over(self.transport, data)

    def _reject_header(self) -> None:
        # RabbitMQ answers a bad header with the header it speaks, then closes. 4.x serves
        # AMQP 1.0 on the same port and offers that (its SASL header) unless the client
        # asked for another AMQP 0-9 revision; 3.10 always offered 0-9-1.
        assert self.transport is not None
        asked = bytes(self.buffer[:8])
        amqp091 = asked.startswith(b"AMQP\x00\x00\x09")
        self.transport.write(framing.PROTOCOL_HEADER if amqp091 else AMQP_1_0_SASL_HEADER)
        self.state = "closed"
        self.transport.close()

    def _on_frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == framing.FRAME_HEARTBEAT:
            return
        if self.state == "closing":
            if frame_type == framing.FRAME_METHOD and payload[:4] in (b"\x00\x0a\x00\x33", b"\x00\x0a\x00\x32"):
                if payload[:4] == b"\x00\x0a\x00\x32":
                    self.send_method(0, C.CloseOk())
                self._finish_close()
            return
        if frame_type == framing.FRAME_METHOD:
            try:
                method = framing.decode_method(payload)
            except errors.UnknownMethod as err:
                raise errors.NotImplemented_(str(err)) from None
            except errors.DecodeError:
                cid, mid = (payload[0] << 8 | payload[1], payload[2] << 8 | payload[3]) if len(payload) >= 4 else (0, 0)
                raise errors.FrameError(f"cannot decode <<{','.join(str(b) for b in payload[4:20])}>>", cid, mid) from None
            if channel == 0:
                self._on_connection_method(method)
            else:
                self._on_channel_method(channel, method)
        elif frame_type in (framing.FRAME_HEADER, framing.FRAME_BODY):
            if self.state != "running":
                raise errors.UnexpectedFrame("expected method frame, got non method frame instead")
            ch = self._channel_for_content(channel)
            if ch is None:
                return
            self._run_on_channel(ch, ch.on_header if frame_type == framing.FRAME_HEADER else ch.on_body, payload)
        else:
            raise errors.FrameError(f"type {frame_type}: unknown_frame")

    def _channel_for_content(self, number: int) -> Channel | None:
        if number in self.closing_channels:
            return None
        ch = self.channels.get(number)
        if ch is None:
            self._check_channel_room()
            raise errors.UnexpectedFrame("expected method frame, got non method frame instead")
        return ch

    def _check_channel_room(self) -> None:
        """RabbitMQ starts a channel for any frame on a number it does not know, and refuses one more
        than channel_max: it limits how many are open (a channel it closed counts until its close-ok),
        whatever their numbers."""
        opened = len(self.channels) + len(self.closing_channels)
        if opened >= self.channel_max:
            raise errors.NotAllowed(f"number of channels opened ({opened}) has reached the negotiated channel_max ({self.channel_max})")

    def _run_on_channel(self, ch: Channel, fn: Any, arg: Any) -> None:
        try:
            fn(arg)
        except errors.AmqpReplyError as err:
            if err.closes_connection:
                raise
            self.close_channel(ch, err)

    # -- connection class -------------------------------------------------------

    def _send_start(self) -> None:
        self.state = "start"
        start = C.Start(server_properties=handshake.server_properties(), mechanisms="PLAIN ANONYMOUS AMQPLAIN", locales="en_US")  # 4.3's
        self.send_method(0, start)

    def _on_connection_method(self, method: Any) -> None:
        if isinstance(method, C.StartOk) and self.state == "start":
            self._on_start_ok(method)
        elif isinstance(method, C.TuneOk) and self.state == "tune":
            self._on_tune_ok(method)
        elif isinstance(method, C.Open) and self.state == "open" and self.server.faults.stall_open:
            pass  # fault injection: a broker that stops answering halfway through the handshake
        elif isinstance(method, C.Open) and self.state == "open":
            if method.virtual_host not in ("/", ""):
                raise errors.NotAllowed(f"vhost {method.virtual_host} not found", 10, 40)
            self.state = "running"
            self.send_method(0, C.OpenOk())
            if self.server.faults.alarm is not None and self.client_capability("connection.blocked"):
                self.send_method(0, C.Blocked(reason=self.server.faults.alarm))
        elif isinstance(method, C.Close):
            self.ended = "closed by client"
            self.send_method(0, C.CloseOk())
            self.state = "closed"
            self._flush()
            if self.transport is not None:
                self.transport.close()
        elif isinstance(method, C.CloseOk):
            self._finish_close()
        elif isinstance(method, C.UpdateSecret) and self.state == "running":
            # RabbitMQ's internal user store accepts any new secret for the logged-in user.
            self.send_method(0, C.UpdateSecretOk())
        else:
            raise errors.CommandInvalid(f"unexpected {method.name} in state {self.state}")

    # -- channels -----------------------------------------------------------------

    def _on_channel_method(self, number: int, method: Any) -> None:
        if self.state != "running":
            raise errors.ChannelError("connection not open", *divmod(method.index, 0x10000))
        if number in self.closing_channels:
            # After we sent channel.close, only close/close-ok are meaningful.
            if isinstance(method, commands.Channel.CloseOk):
                self.closing_channels.discard(number)
            elif isinstance(method, commands.Channel.Close):
                self.send_method(number, commands.Channel.CloseOk())
            return
        ch = self.channels.get(number)
        if ch is None:
            self._check_channel_room()
        if isinstance(method, commands.Channel.Open):
            if ch is not None:
                raise errors.ChannelError("second 'channel.open' seen", 20, 10)
            self.channels[number] = Channel(self, number)
            self.send_method(number, commands.Channel.OpenOk())
            return
        if ch is None:
            raise errors.ChannelError("expected 'channel.open'", *divmod(method.index, 0x10000))
        if isinstance(method, commands.Channel.Close):
            self.channels.pop(number, None)
            ch.close()
            self.send_method(number, commands.Channel.CloseOk())
            return
        if isinstance(method, commands.Channel.CloseOk):
            return
        self._run_on_channel(ch, ch.on_method, method)

    def close_channel(self, ch: Channel, err: errors.AmqpReplyError) -> None:
        """Server-initiated channel close: requeue its deliveries, tell the client."""
        if self.channels.get(ch.number) is not ch:
            return
        # Confirms already decided precede the close, as on RabbitMQ.
        for data in ch.drain_confirms():
            self.write(data)
        del self.channels[ch.number]
        ch.close()
        self.closing_channels.add(ch.number)
        close = commands.Channel.Close.__new__(commands.Channel.Close)
        close.reply_code, close.reply_text, close.class_id, close.method_id = err.code, err.text, err.class_id, err.method_id
        self.send_method(ch.number, close)

    def client_capability(self, name: str) -> bool:
        return bool(self.capabilities.get(name))

    # -- writing ------------------------------------------------------------------

    def loop_time(self) -> float:
        return self.loop.time()

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def write_content(self, channel: int, header: bytes, body: bytes) -> None:
        for data in framing.content_frames(channel, header, body, self.frame_max):
            self.write(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.write(framing.method_frame(channel, method))

    def send_return(self, channel: int, code: int, text: str, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        ret = commands.Basic.Return.__new__(commands.Basic.Return)
        ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key = code, text, exchange, routing_key
        self.send_method(channel, ret)
        self.write_content(channel, header, body)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self.server.faults.confirms_held:
            for ch in self.channels.values():
                if ch.pending_confirms:
                    self._out.extend(ch.drain_confirms())
        if not self._out:
            return
        data = b"".join(self._out)
        self._out = []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- closing --------------------------------------------------------------------

    def close_with(self, err: errors.AmqpReplyError) -> None:
        """Connection exception: send connection.close and wait briefly for close-ok."""
        if self.state in ("closing", "closed"):
            return
        log.info("embedded broker: closing connection %s: %s", self.peer, err.text)
        if self.state == "header":
            self._abort()
            return
        close = C.Close.__new__(C.Close)
        close.reply_code, close.reply_text, close.class_id, close.method_id = err.code, err.text, err.class_id, err.method_id
        self.send_method(0, close)
        self._flush()
        self.state = "closing"
        self._teardown_channels()
        self._close_timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._finish_close)

    def _finish_close(self) -> None:
        self.state = "closed"
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self.state = "closed"
        if self.transport is not None:
            self.transport.abort()

    def drop(self) -> None:
        """Fault injection: vanish like a cut network cable."""
        self._abort()

    def _teardown_channels(self) -> None:
        channels = list(self.channels.values())
        self.channels.clear()
        for ch in channels:
            ch.close()

    def _teardown(self) -> None:
        self.state = "closed"
        for timer in (self._heartbeat_timer, self._close_timer, self._flush_handle):
            if timer is not None:
                timer.cancel()
        self._heartbeat_timer = self._close_timer = self._flush_handle = None
        self._teardown_channels()
        self.server.vhost.connection_closed(self)
        if self in self.server.connections:
            self.server.ended.append((self.client_name, self.ended or "lost"))
        self.server.connections.discard(self)
        self._out = []
        self.buffer = bytearray()
