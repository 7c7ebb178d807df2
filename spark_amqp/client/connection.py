"""``AmqpClient``: one AMQP 0-9-1 connection on asyncio, a ``transport.Connection``.

As in aiormq, the protocol object owns the socket: ``data_received`` cuts
frames and hands them to channels, writes go straight to the transport;
dialing, TLS, the SASL login, heartbeats and token renewal are the transport's.
Every way the connection can end is one exception from ``spark_amqp.errors``
set on ``closed``: a ``connection.close`` from the broker becomes its reply
code's class, a dead socket or silent peer ``ConnectionLost``, TLS or a
non-AMQP peer ``HandshakeFailed``, a refused certificate or token login
``LoginRefused`` / ``TokenError``. Whether to retry is the caller's call,
through ``errors.is_transient``. A connection that logged in with an OAuth 2
token renews it before it expires (``connection.update-secret``; ``transport/renewal.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands

from .. import framing
from ..errors import AmqpProtocolError, CallbackFailed, ConnectionLost, DecodeError, HandshakeFailed, TokenError, reply_error
from ..transport.connection import CLOSE_TIMEOUT, Connection, parse_version
from ..transport.login import Login
from ..transport.options import ConnectionOptions
from ..transport.tokens import Token
from . import consumer
from .channel import ClientChannel

__all__ = ["AmqpClient"]

C = commands.Connection
MAX_FRAME = 131072


class AmqpClient(Connection):
    """One connection; deliveries are handed to channel callbacks from ``data_received``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: ConnectionOptions, client_name: str, login: Login | None = None) -> None:
        super().__init__(loop, options, client_name, login)
        self._secret_ok: asyncio.Future[None] | None = None  # a connection.update-secret awaiting its answer
        self.channels: dict[int, ClientChannel] = {}
        self.frame_max = MAX_FRAME
        # connection.blocked: why the broker stops reading what we publish (a memory or disk alarm).
        self.blocked: str | None = None
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self._next_channel = 1

    def _greet(self) -> None:
        self.write(framing.PROTOCOL_HEADER)

    def _heartbeat_frame(self) -> bytes:
        return framing.HEARTBEAT_FRAME

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self._tail:
            data = self._tail + data
        if not self._opened.done() and data[:4] == b"AMQP":
            self._lost(HandshakeFailed(f"the broker does not speak AMQP 0-9-1 (it answered {data[:8]!r})"))
            return
        offset = 0
        size_of = len(data)
        head = framing.FRAME_HEAD.unpack_from
        channels = self.channels
        try:
            while size_of - offset >= 8:
                ftype, channel, size = head(data, offset)
                end = offset + 7 + size
                if size_of <= end:
                    break
                if ftype == 1 and channel and data.startswith(consumer.DELIVER, offset + 7):
                    # Most frames on a busy connection are deliveries whose three frames came
                    # in one read: handing them over in one call halves the per-message cost.
                    after = consumer.whole_delivery(data, offset + 7, end, channels.get(channel))
                    if after:
                        offset = after
                        continue
                payload = data[offset + 7 : end]
                offset = end + 1
                if channel == 0:
                    if ftype == 1:
                        self._on_connection_method(framing.decode_method(payload))
                    continue
                ch = channels.get(channel)
                if ch is None:
                    continue
                if ftype == 1:
                    ch.on_method(payload)
                elif ftype == 2:
                    ch.on_header(payload)
                elif ftype == 3:
                    ch.on_body(payload)
        except DecodeError as err:
            self._lost(DecodeError(f"undecodable frame from the broker: {err}"))
        except Exception as err:  # asyncio would log it and drop the socket: the caller must see it instead
            failure = CallbackFailed(f"processing a frame from the broker failed: {type(err).__name__}: {err}")
            failure.__cause__ = err
            self.abort(failure)
        finally:
            self._tail = data[offset:]

    # -- connection class -------------------------------------------------------------

    def _on_connection_method(self, method: Any) -> None:
        if isinstance(method, C.Start):
            self.server_version = parse_version((method.server_properties or {}).get("version"))
            props: dict[str, Any] = {
                "product": "spark-amqp",
                "connection_name": self.client_name,
                "capabilities": {
                    "authentication_failure_close": True,
                    "consumer_cancel_notify": True,
                    "basic.nack": True,
                    "publisher_confirms": True,
                    "connection.blocked": True,
                },
            }
            mechanisms = method.mechanisms.decode() if isinstance(method.mechanisms, bytes) else str(method.mechanisms or "")
            refusal = self.login.not_offered(mechanisms.split())
            if refusal is not None:
                self.abort(refusal)
                return
            response = self.login.response()
            self.send_method(0, C.StartOk(client_properties=props, mechanism=self.login.mechanism, response=response, locale="en_US"))
        elif isinstance(method, C.Tune):
            self.frame_max = min(method.frame_max or MAX_FRAME, MAX_FRAME)
            channel_max = method.channel_max or 2047
            heartbeat = self._agree_heartbeat(method.heartbeat)
            self.send_method(0, C.TuneOk(channel_max=channel_max, frame_max=self.frame_max, heartbeat=heartbeat))
            self.send_method(0, framing.build(C.Open, virtual_host=self.options.vhost, capabilities="", insist=False))
        elif isinstance(method, C.OpenOk):
            if not self._opened.done():
                self._opened.set_result(None)
            self._renew_token(self._update_secret)
        elif isinstance(method, C.Close):
            self.send_method(0, C.CloseOk())
            code = method.reply_code or 0
            reason: AmqpProtocolError = reply_error(
                code, method.reply_text or "", method.class_id or 0, method.method_id or 0, on_connection=True
            )
            if code == 403 and not self._opened.done():
                reason = self.login.refused(reason)
            elif code in (403, 530) and self._secret_ok is not None and self.options.oauth2 is not None:
                # RabbitMQ 4.3 answers a refused update-secret by closing the connection (530 "Secret update failed").
                reason = TokenError(f"the broker refused the renewed OAuth 2 token from {self.options.oauth2.source} ({reason})")
            self._lost(reason)
        elif isinstance(method, C.UpdateSecretOk):
            if self._secret_ok is not None and not self._secret_ok.done():
                self._secret_ok.set_result(None)
        elif isinstance(method, C.CloseOk):
            self._lost(ConnectionLost("closed"))
        elif isinstance(method, C.Blocked):
            self.blocked = method.reason or "no reason given"
            self.unblocked.clear()
        elif isinstance(method, C.Unblocked):
            self.blocked = None
            self.unblocked.set()

    def _fail_waiting(self, reason: AmqpProtocolError) -> None:
        if self._secret_ok is not None and not self._secret_ok.done():
            self._secret_ok.set_exception(reason)
            self._secret_ok.exception()
        for ch in list(self.channels.values()):
            ch._finish(reason)

    # -- API ----------------------------------------------------------------------------

    def send_method(self, channel: int, method: Any) -> None:
        self.write(framing.method_frame(channel, method))

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

    async def _update_secret(self, token: Token) -> None:
        """Give the broker a renewed token (``Renewal``); it answers update-secret-ok, or closes the connection."""
        self._secret_ok = self.loop.create_future()
        try:
            self.send_method(0, C.UpdateSecret(new_secret=token.value, reason="OAuth 2 token renewed"))
            await asyncio.wait_for(asyncio.shield(self._secret_ok), self.options.connection_timeout)
        except TimeoutError:
            err = ConnectionLost(f"no answer to connection.update-secret within connectionTimeout={self.options.connection_timeout:g}s")
            self.abort(err)  # a broker that does not answer will not keep the connection past the token's expiry either
            raise err from None
        finally:
            self._secret_ok = None

    async def close(self) -> None:
        if self.closed.done():
            return
        self.send_method(0, framing.build(C.Close, reply_code=200, reply_text="bye", class_id=0, method_id=0))
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), CLOSE_TIMEOUT)
        except TimeoutError:
            self.abort(ConnectionLost("closed"))
