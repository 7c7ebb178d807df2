"""``Connection``: what every protocol's client connection is before it speaks its protocol.

The AMQP 0-9-1 client (``client.AmqpClient``) and the stream-protocol client
(``stream_protocol.StreamClient``) are ``Connection``s; a third protocol's client is one too. As in
aiormq, the connection object is the socket's asyncio protocol and owns it. Here is what they share:
``connect`` (a token fetched once, then the walk over the uri's endpoints, ``dial.py``), the peer's
name, heartbeats (a frame when nothing was sent for half the interval, a lost connection when nothing
came for two), the token's renewal while open (``renewal.py``), and one way to end: every ending is one
``AmqpProtocolError`` set on ``closed``, after which nothing is written.

A subclass cuts its own frames in ``data_received``, runs its handshake in ``_open`` (or sets
``_opened`` when its handshake completes), and fails what waits on it in ``_fail_waiting``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, Self

from ..errors import AmqpProtocolError, CallbackFailed, ConnectionLost
from .dial import open_within_timeout
from .endpoints import Endpoint
from .login import Login
from .options import ConnectionOptions
from .renewal import Renewal
from .tls import lost, peer
from .tokens import Token

__all__ = ["CLOSE_TIMEOUT", "Connection", "parse_version"]

# How long a polite close waits for the broker's answer before it drops the socket.
CLOSE_TIMEOUT = 5.0


def parse_version(value: Any) -> tuple[int, int] | None:
    """(major, minor) of a ``version`` server property such as ``4.3.6`` or ``3.10.8``."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


class Connection(asyncio.Protocol):
    """One connection to one broker node; subclasses speak a protocol over it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: ConnectionOptions, client_name: str, login: Login | None = None) -> None:
        self.loop = loop
        self.options = options
        self.client_name = client_name
        self.login = login or Login(options)
        self.peer = "the broker"  # host:port once connected
        self.endpoint: Endpoint | None = None  # the uri's endpoint it was opened to
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[AmqpProtocolError] = loop.create_future()
        self.server_version: tuple[int, int] | None = None  # the broker's (major, minor), when it says
        self.heartbeat = 0.0  # seconds, as agreed with the broker (0: none)
        self._send_every = self._silence = 0.0
        self.renewal: Renewal | None = None  # with an OAuth 2 token: renews it while the connection is open
        self._opened: asyncio.Future[None] = loop.create_future()  # the handshake is done
        self._tail = b""  # the start of a frame not yet whole
        self._last_recv = 0.0
        self._last_sent = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    async def connect(cls, options: ConnectionOptions, client_name: str, last: Endpoint | None = None) -> Self:
        """Connect, log in and open on the first endpoint that lets us (``connectionTimeout`` each; ``last`` after
        the others); nothing is left open on failure."""
        loop = asyncio.get_running_loop()
        login = await Login.prepare(options)  # a token is fetched once for the whole walk over the endpoints
        return await open_within_timeout(options, lambda: cls(loop, options, client_name, login), lambda c: c._open(), last)

    async def _open(self) -> None:
        """The handshake, once the socket is up; by default, waiting until the protocol's frames complete it."""
        await asyncio.shield(self._opened)

    def _greet(self) -> None:
        """What the client sends first, as soon as the socket is up (a protocol header, or nothing)."""

    def _heartbeat_frame(self) -> bytes:
        raise NotImplementedError

    def _fail_waiting(self, reason: AmqpProtocolError) -> None:
        """The connection ended: fail whatever still waits on it (requests, channels)."""

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = peer(transport)
        self._last_recv = self._last_sent = self.loop.time()
        self._greet()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(lost(exc, self.peer, self.options.tls))

    # -- for subclasses -------------------------------------------------------------

    def _agree_heartbeat(self, offered: int) -> int:
        """The interval both sides keep (the lower of the two; the option's when the broker offers none),
        and heartbeats started on it: a frame at least every half of it, silence for two of it an end."""
        heartbeat = min(self.options.heartbeat, offered) if offered else self.options.heartbeat
        self._start_heartbeats(heartbeat / 2, 2 * heartbeat)
        return heartbeat

    def _start_heartbeats(self, send_every: float, silence: float) -> None:
        """A frame whenever nothing was sent for ``send_every`` seconds, and the connection lost once nothing came for
        ``silence`` (protocols that do not negotiate one interval, AMQP 1.0, set them apart)."""
        self.heartbeat = silence / 2
        self._send_every, self._silence = send_every, silence
        if send_every > 0:
            self._timer = self.loop.call_later(min(send_every, silence / 4), self._beat)

    def _beat(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if now - self._last_recv > self._silence:
            self.abort(ConnectionLost(f"nothing from the broker for {self._silence:g}s: missed heartbeats"))
            return
        if now - self._last_sent >= self._send_every:  # any frame counts as one
            self.write(self._heartbeat_frame())
        self._timer = self.loop.call_later(min(self._send_every, self._silence / 4), self._beat)

    def _renew_token(self, apply: Callable[[Token], Awaitable[None]]) -> None:
        """Once open: with an OAuth 2 token, renew it before it expires (``apply`` gives the broker the new one)."""
        if self.login.token is not None:
            self.renewal = Renewal(self.loop, self.options, self.login.token, apply, self.abort, self.client_name)
            self.renewal.start()

    def _frames_failed(self, err: Exception) -> None:
        """What processing the broker's frames raised ends the connection: the protocol's own error as it is, any
        other (a delivery handler's bug) as ``CallbackFailed``, since asyncio would only log it and drop the socket."""
        if isinstance(err, AmqpProtocolError):
            self.abort(err)
            return
        failure = CallbackFailed(f"processing a frame from the broker failed: {type(err).__name__}: {err}")
        failure.__cause__ = err
        self.abort(failure)

    def _lost(self, reason: AmqpProtocolError) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.renewal is not None:
            self.renewal.cancel()
        if not self._opened.done():
            self._opened.set_exception(reason)
            self._opened.exception()  # retrieved: connect() reports it
        if not self.closed.done():
            self.closed.set_result(reason)
        self._fail_waiting(reason)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- API ----------------------------------------------------------------------------

    @property
    def last_heard(self) -> float:
        """When the broker last sent anything, a heartbeat included (``time.monotonic``, the loop's clock): an outage
        found by missed heartbeats or a question's timeout began then (``Outage.failed``)."""
        return self._last_recv

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._last_sent = self.loop.time()
            self.transport.write(data)

    def abort(self, reason: AmqpProtocolError) -> None:
        """Drop the socket at once (no close handshake) and fail everything waiting with ``reason``."""
        if self.transport is not None:
            self.transport.abort()
        self._lost(reason)
