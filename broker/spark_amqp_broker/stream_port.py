"""RabbitMQ's stream protocol on the embedded broker: one connection (the ``rabbitmq_stream`` port).

The handshake answers as RabbitMQ 4.3's reader does (rabbit_stream_reader.erl): peer
properties, SASL (PLAIN, AMQPLAIN, ANONYMOUS), then the broker's tune, the client's tune,
and open. Until open, frames above 8 KiB, an unexpected command or a refused mechanism
close the socket; a wrong password or vhost is answered three seconds late and then the
socket closes (RabbitMQ's tarpit against password guessing). After open a command the
broker does not know, or a frame above the negotiated size, gets a close request.

The commands themselves are ``stream_commands.StreamCommands``; frames go out through
``write`` and leave together once per event-loop pass, as the AMQP 0-9-1 connection does.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING

from spark_amqp import errors
from spark_amqp.stream_protocol.wire import OK, RESPONSE, Key, Reader, command, frame, map_, response, string, strings

from .handshake import MODELLED_VERSION
from .stream_commands import Handler, StreamCommands

if TYPE_CHECKING:
    from .server import BrokerServer

log = logging.getLogger("spark_amqp_broker")

FRAME_MAX = 1_048_576  # RabbitMQ's default stream frame_max
INITIAL_FRAME_MAX = 8192  # what it takes before open
SILENT_CLOSE_DELAY = 3.0  # a refused login or vhost is answered this late
STEP_TIMEOUT = 10.0  # a client that stalls in the handshake, or after a close, loses the socket
MECHANISMS = ("PLAIN", "ANONYMOUS", "AMQPLAIN")
_SIZE = struct.Struct(">I")
_HEAD = struct.Struct(">HH")
_U16 = struct.Struct(">H")


class StreamConnection(StreamCommands, asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        super().__init__(server)
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        # peer -> sasl -> tuning (after login) -> tuned -> open; silent, close_sent, closed
        self.state = "peer"
        self.frame_limit = INITIAL_FRAME_MAX
        self.frame_max = FRAME_MAX
        self.heartbeat = 0
        self.client_name = ""
        self.user = ""
        self.mechanism = ""
        self.peer = ""
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_recv = self._last_sent = 0.0
        self._handlers: dict[int, Handler] = self.command_handlers()

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._last_recv = self._last_sent = self.loop.time()
        self.server.stream_connections.add(self)
        self._timer = self.loop.call_later(STEP_TIMEOUT, self._step_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = "closed"
        for handle in (self._timer, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._out = []
        self.forget_streams()
        self.server.stream_connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self.state in ("closed", "silent"):
            return
        self.buffer += data
        buf = self.buffer
        offset = 0
        try:
            while len(buf) - offset >= 4 and self.state not in ("closed", "silent"):
                (size,) = _SIZE.unpack_from(buf, offset)
                if size > self.frame_limit:
                    self._too_large(size)
                    break
                if len(buf) - offset - 4 < size:
                    break
                payload = bytes(buf[offset + 4 : offset + 4 + size])
                offset += 4 + size
                self._on_frame(payload)
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("embedded broker: internal error on stream connection %s", self.peer)
            self.drop()
        finally:
            del buf[:offset]

    # -- frames -------------------------------------------------------------------------

    def _on_frame(self, payload: bytes) -> None:
        if len(payload) < 4:
            self._unknown()
            return
        key, version = _HEAD.unpack_from(payload)
        reader = Reader(payload, 4)
        if key == Key.HEARTBEAT:
            return
        if self.state == "close_sent":
            if key == Key.CLOSE | RESPONSE:
                self.close_socket()
            return
        try:
            if self.state == "open":
                handler = self._handlers.get(key)
                if handler is None or not self.version_known(key, version):
                    self._unknown()
                else:
                    handler(reader, version)
            else:
                self._pre_open(key, reader)
        except errors.DecodeError:
            self._unknown()

    def _pre_open(self, key: int, r: Reader) -> None:
        # The client's tune: RabbitMQ's Java client sends it with the response bit set, others without; both are taken.
        if key & ~RESPONSE == Key.TUNE and self.state == "tuning":
            client_max, heartbeat = r.u32(), r.u32()
            self.frame_max = min(client_max, FRAME_MAX) if client_max else FRAME_MAX
            self.heartbeat = heartbeat
            self.state = "tuned"
            return
        if key not in (Key.PEER_PROPERTIES, Key.SASL_HANDSHAKE, Key.SASL_AUTHENTICATE, Key.OPEN):
            self.drop()  # RabbitMQ stops the connection on anything else before open
            return
        correlation = r.u32()
        if key == Key.PEER_PROPERTIES and self.state == "peer":
            properties = r.map()
            self.client_name = properties.get("connection_name", "")
            self.write(response(Key.PEER_PROPERTIES, correlation, OK, map_(self.server_properties())))
            self.state = "sasl"
        elif key == Key.SASL_HANDSHAKE and self.state == "sasl":
            self.write(response(Key.SASL_HANDSHAKE, correlation, OK, strings(MECHANISMS)))
        elif key == Key.SASL_AUTHENTICATE and self.state == "sasl":
            self._authenticate(correlation, r.text(), sasl_bytes(r))
        elif key == Key.OPEN and self.state == "tuned":
            vhost = r.text()
            if vhost != "/":
                self._refuse(response(Key.OPEN, correlation, 0x0C))
                return
            advertised = {"advertised_host": self.server.advertised_host, "advertised_port": str(self.server.stream_port)}
            self.write(response(Key.OPEN, correlation, OK, map_(advertised)))
            self.state = "open"
            self.frame_limit = self.frame_max
            self._schedule_heartbeat()
        else:
            self.drop()

    def _authenticate(self, correlation: int, mechanism: str, secret: bytes) -> None:
        if mechanism not in MECHANISMS:
            self.write(response(Key.SASL_AUTHENTICATE, correlation, 0x07))
            self.close_socket()
            return
        credentials = _credentials(mechanism, secret)
        if credentials is None:
            self.write(response(Key.SASL_AUTHENTICATE, correlation, 0x09))
            self.close_socket()
            return
        user, password = credentials if mechanism != "ANONYMOUS" else (self.server.user, self.server.password)
        if not self.server.authenticate(user, password):
            log.info("embedded broker: stream login refused for user %r from %s", user, self.peer)
            self._refuse(response(Key.SASL_AUTHENTICATE, correlation, 0x08))
            return
        self.user, self.mechanism = user, mechanism
        self.write(response(Key.SASL_AUTHENTICATE, correlation, OK))
        self.write(frame(Key.TUNE, 1, _SIZE.pack(FRAME_MAX) + _SIZE.pack(self.server.heartbeat)))
        self.state = "tuning"

    def reauthenticate(self, r: Reader, _version: int) -> None:
        """A sasl_authenticate after open: a new secret for the same user (a refreshed token)."""
        correlation, mechanism = r.u32(), r.text()
        credentials = _credentials(mechanism, sasl_bytes(r)) if mechanism == self.mechanism else None
        if credentials is None:
            self._refuse(response(Key.SASL_AUTHENTICATE, correlation, 0x14 if mechanism != self.mechanism else 0x09))
        elif credentials[0] != self.user:
            self._refuse(response(Key.SASL_AUTHENTICATE, correlation, 0x15))
        elif not self.server.authenticate(*credentials):
            self._refuse(response(Key.SASL_AUTHENTICATE, correlation, 0x08))
        else:
            self.write(response(Key.SASL_AUTHENTICATE, correlation, OK))

    def server_properties(self) -> dict[str, str]:
        return {
            "product": "spark-amqp embedded broker",
            "version": f"{MODELLED_VERSION[0]}.{MODELLED_VERSION[1]}.0",
            "platform": "Python asyncio",
            "cluster_name": "embedded",
        }

    # -- closing ------------------------------------------------------------------------

    def _refuse(self, answer: bytes) -> None:
        """RabbitMQ's silent close: nothing more is read, the answer comes late, then the socket closes."""
        self.state = "silent"

        def answer_and_close() -> None:
            self.write(answer)
            self.close_socket()

        self.loop.call_later(SILENT_CLOSE_DELAY, answer_and_close)

    def _unknown(self) -> None:
        self.send_close(0x0D, "unknown frame")

    def _too_large(self, size: int) -> None:
        log.info("embedded broker: stream frame of %d bytes above %d from %s", size, self.frame_limit, self.peer)
        if self.state != "open":
            self.drop()
        else:
            self.send_close(0x0E, "frame too large")

    def send_close(self, code: int, reason: str) -> None:
        """Ask the client to close; the socket closes on its answer, or after a while without one."""
        if self.state in ("close_sent", "closed"):
            return
        self.write(command(Key.CLOSE, 1, _U16.pack(code) + string(reason)))
        self.state = "close_sent"
        self.loop.call_later(STEP_TIMEOUT, self.close_socket)

    def on_close(self, correlation: int) -> None:
        """The client's close: answered, then the socket closes (RabbitMQ ignores anything after it)."""
        self.write(response(Key.CLOSE, correlation, OK))
        self.close_socket()

    def close_socket(self) -> None:
        self._flush()
        self.state = "closed"
        if self.transport is not None:
            self.transport.close()

    def drop(self) -> None:
        """Close at once, without a word (also: fault injection, a cut network cable)."""
        self.state = "closed"
        self._out = []
        if self.transport is not None:
            self.transport.abort()

    def _step_timeout(self) -> None:
        self._timer = None
        if self.state not in ("open", "closed", "silent"):
            self.drop()

    # -- heartbeats and writing ---------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat:
            self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        self._timer = None
        if self.state == "closed":
            return
        now = self.loop.time()
        if now - self._last_recv > 2 * self.heartbeat:
            log.info("embedded broker: missed heartbeats from stream client %s", self.peer)
            self.drop()
            return
        if now - self._last_sent >= self.heartbeat / 2:
            self.write(frame(Key.HEARTBEAT, 1))
        self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def write(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self._out:
            return
        data = b"".join(self._out)
        self._out = []
        if self.transport is not None and not self.transport.is_closing():
            self._last_sent = self.loop.time()
            self.transport.write(data)


def sasl_bytes(r: Reader) -> bytes:
    """SASL authenticate's opaque data: bytes with an int32 length, -1 for none."""
    if r.at_end:
        return b""
    size = struct.unpack(">i", r.raw(4))[0]
    return b"" if size < 0 else r.raw(size)


def _credentials(mechanism: str, secret: bytes) -> tuple[str, str] | None:
    """(user, password) from a SASL response; None when it is malformed (RabbitMQ: SASL error)."""
    if mechanism == "ANONYMOUS":
        return ("", "")
    if mechanism == "PLAIN":
        parts = secret.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    from pamqp import decode

    try:
        _, table = decode.field_table(len(secret).to_bytes(4, "big") + secret)
    except (ValueError, struct.error):
        return None
    return str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
