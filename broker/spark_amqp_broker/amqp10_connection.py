"""One AMQP 1.0 client connection, as RabbitMQ 4.x serves it on its AMQP port: SASL, open, heartbeats, close.

``BrokerConnection`` reads the protocol header; an AMQP 1.0 one (SASL's, or the bare header RabbitMQ answers with
SASL's before it closes: it wants a login first) hands the socket over here (``take_over``). Logins: PLAIN with the
broker's user and password, and ANONYMOUS as guest (RabbitMQ 4's default ``anonymous_login_user``); a refused one
is SASL outcome 1 (auth), then the socket closes. AMQPLAIN is offered and taken too, as 4.3 does. Frames a connection writes are gathered and flushed once per
event-loop pass, as AMQP 0-9-1's are. Sessions (``amqp10_session``) are numbered by the client's channel.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from spark_amqp import errors
from spark_amqp.amqp10 import performatives as p
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Symbol, UByte, UInt, UShort

from .amqp10_frames import condition_of, description, error, performative
from .amqp10_session import Session
from .handshake import MODELLED_VERSION, credentials

if TYPE_CHECKING:
    from .server import BrokerServer

log = logging.getLogger("spark_amqp_broker")

MAX_FRAME = 131072  # what RabbitMQ 4.x offers (its frame_max)
CHANNEL_MAX = 65535
_SIZE = struct.Struct(">I")
_HEADER_TIMEOUT = 10.0


_TRANSFER = b"\x00\x53\x14\xc0"


def _transfer(data: bytes) -> tuple[int, list[Any], bytes] | None:
    """(channel, fields, payload) of a transfer encoded the common way (a small list; handle and delivery id small,
    whole or zero uints; a binary tag; the format a uint; settled and more as booleans), else None."""
    if data[4] != 2 or data[5] != 0 or data[8:12] != _TRANSFER:
        return None
    size, count = data[12], data[13]
    end = 13 + size
    if count < 2 or end > len(data):
        return None
    at = 14
    fields: list[Any] = []
    for i in range(count):
        code = data[at]
        if code in (0x52, 0x50, 0x53):
            fields.append(data[at + 1])
            at += 2
        elif code in (0x70, 0x71):
            fields.append(_SIZE.unpack_from(data, at + 1)[0])
            at += 5
        elif code in (0x43, 0x44):
            fields.append(0)
            at += 1
        elif code in (0x40, 0x41, 0x42):
            fields.append(None if code == 0x40 else code == 0x41)
            at += 1
        elif code == 0xA0 and i == 2:
            fields.append(data[at + 2 : at + 2 + data[at + 1]])
            at += 2 + data[at + 1]
        else:
            return None
    if at != end:
        return None
    return int.from_bytes(data[6:8], "big"), fields, data[end:]


class Amqp10Connection(asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = "sasl header"  # -> sasl -> amqp header -> open -> running -> closed
        self.sessions: dict[int, Session] = {}
        self.max_frame = 512  # the client's, once its open says (the spec's minimum until then)
        self.client_name = ""
        self.user = ""
        self.ended = ""
        self.write_paused = False
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._last_recv = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._idle_out = 0.0  # seconds between our empty frames (half the client's idle-time-out)
        self.peer = ""

    def take_over(self, transport: asyncio.Transport, data: bytes) -> None:
        """The socket, from ``BrokerConnection``, with what was read so far (the AMQP 1.0 header first)."""
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._last_recv = self.loop.time()
        self.server.amqp10_connections.add(self)
        self._timer = self.loop.call_later(_HEADER_TIMEOUT, self._handshake_timeout)
        transport.set_protocol(self)
        self.data_received(data)

    # -- asyncio.Protocol -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self.state == "closed":
            return
        self.buffer += data
        try:
            self._process()
        except errors.AmqpReplyError as err:
            self.close_with(condition_of(err), description(err))
        except errors.DecodeError as err:
            self.close_with("amqp:decode-error", str(err))
        except Exception:  # a bug costs one connection, never the broker
            log.exception("embedded broker: internal error on AMQP 1.0 connection %s", self.peer)
            self.close_with("amqp:internal-error", "internal error")

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for session in list(self.sessions.values()):
            session.wake()

    # -- frames ---------------------------------------------------------------------------

    def _process(self) -> None:
        buf = self.buffer
        offset = 0
        try:
            while self.state != "closed":
                if self.state in ("sasl header", "amqp header"):
                    if len(buf) - offset < 8:
                        break
                    self._on_header(bytes(buf[offset : offset + 8]))
                    offset += 8
                    continue
                if len(buf) - offset < 8:
                    break
                (size,) = _SIZE.unpack_from(buf, offset)
                if size < 8 or size > MAX_FRAME:
                    raise errors.DecodeError(f"frame of {size} bytes (max-frame-size {MAX_FRAME})")
                if len(buf) - offset < size:
                    break
                data = bytes(buf[offset : offset + size])
                offset += size
                fast = _transfer(data) if self.state == "running" else None
                if fast is not None:  # most frames of a publisher: read by hand
                    session = self.sessions.get(fast[0])
                    if session is None:
                        raise errors.FrameError(f"a transfer on channel {fast[0]}, which has no session")
                    session.on_transfer(fast[1], fast[2])
                else:
                    self._on_frame(p.read_frame(data, 0, size))
        finally:
            del buf[:offset]

    def _on_header(self, header: bytes) -> None:
        assert self.transport is not None
        if self.state == "sasl header" and header == p.SASL_HEADER:
            self.write(p.SASL_HEADER)
            # A multiple symbol field is an array (0xe0 of 0xa3), as RabbitMQ sends it: proton takes no list there.
            offered = ("PLAIN", "AMQPLAIN", "ANONYMOUS") if self.server.anonymous_user() else ("PLAIN", "AMQPLAIN")  # 4.3's order
            names = [m.encode() for m in offered]
            items = b"".join(bytes((len(n),)) + n for n in names)
            array = bytes((0xE0, len(items) + 2, len(names), 0xA3)) + items
            body = b"\x00\x53\x40\xc0" + bytes((len(array) + 1, 1)) + array
            self.write(p.frame(0, body, kind=1))
            self.state = "sasl"
        elif self.state == "amqp header" and header == p.AMQP_HEADER:
            self.write(p.AMQP_HEADER)
            self.state = "open"
        else:
            # RabbitMQ wants a login first: a bare AMQP 1.0 header (or another) is answered with SASL's.
            self.transport.write(p.SASL_HEADER)
            self._abort(close=True)

    def _on_frame(self, frame: p.Frame) -> None:
        if frame.kind == 1:
            if frame.code == P.SASL_INIT and self.state == "sasl":
                self._on_sasl_init(frame.fields)
                return
            raise errors.FrameError("unexpected SASL frame")
        if frame.code is None:
            return  # an empty frame: a heartbeat
        if self.state == "open":
            if frame.code != P.OPEN:
                raise errors.FrameError("expected open")
            self._on_open(frame.fields)
            return
        if self.state != "running":
            return  # closing: nothing but close matters, and close-ok is the socket's end
        if frame.code == P.CLOSE:
            self.ended = "closed by client"
            self.write(performative(0, P.CLOSE, []))
            self._finish()
        elif frame.code == P.BEGIN:
            self._on_begin(frame.channel, frame.fields)
        elif frame.code == P.END:
            session = self.sessions.pop(frame.channel, None)
            if session is not None:
                session.ended()
                self.write(performative(frame.channel, P.END, []))
        else:
            session = self.sessions.get(frame.channel)
            if session is None:
                raise errors.FrameError(f"a frame on channel {frame.channel}, which has no session")
            session.on_frame(frame)

    def _on_sasl_init(self, fields: list[Any]) -> None:
        mechanism = str(fields[0]) if fields else ""
        response = bytes(fields[1]) if len(fields) > 1 and isinstance(fields[1], bytes) else b""
        user = ""
        if mechanism in ("PLAIN", "AMQPLAIN"):
            # The responses are AMQP 0-9-1's for the same mechanisms (AMQPLAIN's a field table).
            name, password = credentials(SimpleNamespace(mechanism=mechanism, response=response))  # type: ignore[arg-type]
            user = name if name and self.server.authenticate(name, password) else ""
        elif mechanism == "ANONYMOUS":
            user = self.server.anonymous_user() or ""  # RabbitMQ 4's anonymous_login_user, guest
        if not user:
            self.write(performative(0, P.SASL_OUTCOME, [UByte(1)], kind=1))
            self._flush()
            self._abort(close=True)
            return
        self.user = user
        self.write(performative(0, P.SASL_OUTCOME, [UByte(0)], kind=1))
        self.state = "amqp header"

    def _on_open(self, fields: list[Any]) -> None:
        if self.server.faults.stall_open:
            return  # fault injection: a broker that stops answering halfway through the handshake
        self.max_frame = max(512, min(int(fields[2]) if len(fields) > 2 and fields[2] else MAX_FRAME, MAX_FRAME))
        properties = fields[9] if len(fields) > 9 and isinstance(fields[9], dict) else {}
        self.client_name = str(properties.get("connection_name", "") or "")
        idle_ms = int(fields[4]) if len(fields) > 4 and fields[4] else 0
        self.state = "running"
        ours = {
            Symbol("product"): "RabbitMQ",  # what clients (the connector's) check to speak address format v2
            Symbol("version"): f"{MODELLED_VERSION[0]}.{MODELLED_VERSION[1]}.0",
            Symbol("platform"): "Python asyncio (spark-amqp embedded broker)",
        }
        heartbeat_ms = self.server.heartbeat * 1000
        answer = [
            f"spark-amqp-broker-{uuid.uuid4()}",
            None,
            UInt(MAX_FRAME),
            UShort(CHANNEL_MAX),
            UInt(heartbeat_ms) if heartbeat_ms else None,
        ]
        self.write(performative(0, P.OPEN, [*answer, None, None, None, None, ours]))
        if self._timer is not None:
            self._timer.cancel()
        self._idle_out = idle_ms / 2000 if idle_ms else 0.0
        if self._idle_out or heartbeat_ms:
            self._timer = self.loop.call_later(self._tick(), self._heartbeat)

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        if channel in self.sessions:
            raise errors.FrameError(f"a second begin on channel {channel}")
        session = Session(self, channel, fields)
        self.sessions[channel] = session
        session.begin()

    def alarm_cleared(self) -> None:
        """Publishers whose credit an alarm held back get it."""
        from .amqp10_links import IncomingLink

        for session in self.sessions.values():
            for link in list(session.links.values()):
                if isinstance(link, IncomingLink) and link.blocked:
                    link.grant()

    # -- heartbeats ------------------------------------------------------------------------

    def _tick(self) -> float:
        candidates = [t for t in (self._idle_out, self.server.heartbeat / 2) if t]
        return min(candidates) if candidates else 30.0

    def _heartbeat(self) -> None:
        self._timer = None
        if self.state == "closed":
            return
        now = self.loop.time()
        if self.server.heartbeat and now - self._last_recv > 2 * self.server.heartbeat:
            log.info("embedded broker: AMQP 1.0 client %s silent for two idle timeouts; dropping it", self.peer)
            self._abort()
            return
        if self._idle_out:
            self.write(p.HEARTBEAT)
        self._timer = self.loop.call_later(self._tick(), self._heartbeat)

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state != "running":
            self._abort()

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self.server.faults.confirms_held:
            for session in self.sessions.values():
                session.release_outcomes()
        if not self._out:
            return
        data = b"".join(self._out)
        self._out = []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- ending ----------------------------------------------------------------------------

    def close_with(self, condition: str, description: str) -> None:
        """Close the connection with an error, as RabbitMQ does (then the socket)."""
        if self.state == "closed":
            return
        log.info("embedded broker: closing AMQP 1.0 connection %s: %s %s", self.peer, condition, description)
        if self.state == "running":
            self.write(performative(0, P.CLOSE, [error(condition, description)]))
        self._finish()

    def _finish(self) -> None:
        self._flush()
        self._teardown()
        if self.transport is not None:
            self.transport.close()

    def _abort(self, close: bool = False) -> None:
        self._teardown()
        if self.transport is not None:
            self.transport.close() if close else self.transport.abort()

    def drop(self) -> None:
        """Fault injection: vanish like a cut network cable."""
        self._abort()

    def _teardown(self) -> None:
        if self.state == "closed" and self not in self.server.amqp10_connections:
            return
        self.state = "closed"
        for handle in (self._timer, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._timer = self._flush_handle = None
        sessions = list(self.sessions.values())
        self.sessions.clear()
        for session in sessions:
            session.ended()
        self.server.vhost.connection_closed(self)
        if self in self.server.amqp10_connections:
            self.server.ended.append((self.client_name, self.ended or "lost"))
            self.server.amqp10_connections.discard(self)
        self._out = []
