"""The connection handshake (start, tune, open) and heartbeats: what the broker says,
what it accepts, and when it gives up on a client."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from spark_amqp import errors, framing

if TYPE_CHECKING:
    from .server import BrokerServer

log = logging.getLogger("spark_amqp_broker")

C = commands.Connection
# Where RabbitMQ 3.10 and 4.x differ, the embedded broker behaves as this line (the newest CI runs).
MODELLED_VERSION = (4, 3)
SERVER_CHANNEL_MAX = 2047
SERVER_FRAME_MAX = 131072
FRAME_MIN_SIZE = 8192  # RabbitMQ 4.3 resets a connection that tunes below it (3.10 and 4.0: 4096)


def server_properties() -> dict[str, Any]:
    return {
        "product": "spark-amqp embedded broker",
        # The RabbitMQ line it behaves as, so that clients (and the connector) that check
        # the version see what to expect.
        "version": f"{MODELLED_VERSION[0]}.{MODELLED_VERSION[1]}.0",
        "platform": "Python asyncio",
        "capabilities": {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "exchange_exchange_bindings": True,
            "per_consumer_qos": True,
            "authentication_failure_close": True,
            "connection.blocked": True,
        },
    }


def credentials(method: commands.Connection.StartOk) -> tuple[str, str]:
    """User and password from a start-ok (PLAIN or AMQPLAIN); empty strings when unreadable."""
    response = method.response
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
    if method.mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    elif method.mechanism == "AMQPLAIN":
        from pamqp import decode

        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
            return str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
        except ValueError:
            pass
    return "", ""


class HandshakeMethods:
    """Mixed into ``BrokerConnection``."""

    server: BrokerServer
    loop: asyncio.AbstractEventLoop
    state: str
    peer: str
    user: str
    client_name: str
    capabilities: dict[str, Any]
    channel_max: int
    frame_max: int
    heartbeat: int
    _last_recv: float
    _heartbeat_timer: asyncio.TimerHandle | None

    if TYPE_CHECKING:  # provided by BrokerConnection

        def client_capability(self, name: str) -> bool: ...
        def close_with(self, err: errors.AmqpReplyError) -> None: ...
        def _abort(self) -> None: ...
        def send_method(self, channel: int, method: Any) -> None: ...
        def write(self, data: bytes) -> None: ...

    def _on_start_ok(self, method: C.StartOk) -> None:
        caps = (method.client_properties or {}).get("capabilities")
        self.capabilities = dict(caps) if isinstance(caps, dict) else {}
        name = (method.client_properties or {}).get("connection_name")
        self.client_name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name or "")
        user, password = credentials(method)
        if method.mechanism == "ANONYMOUS":
            user = self.server.anonymous_user() or ""
        if not user or (method.mechanism != "ANONYMOUS" and not self.server.authenticate(user, password)):
            log.info("embedded broker: login refused for user %r from %s", user, self.peer)
            if self.client_capability("authentication_failure_close"):
                self.close_with(
                    errors.AccessRefused(
                        f"Login was refused using authentication mechanism {method.mechanism}. For details see the broker logfile.",
                    )
                )
            else:
                self._abort()
            return
        self.user = user
        self.state = "tune"
        self.send_method(0, C.Tune(channel_max=SERVER_CHANNEL_MAX, frame_max=SERVER_FRAME_MAX, heartbeat=self.server.heartbeat))

    def _on_tune_ok(self, method: C.TuneOk) -> None:
        if method.channel_max == 0 or method.channel_max > SERVER_CHANNEL_MAX:
            # RabbitMQ refuses "no limit" and closes the socket without a close frame.
            log.info("embedded broker: negotiated channel_max %s is above %s", method.channel_max, SERVER_CHANNEL_MAX)
            self._abort()
            return
        frame_max = method.frame_max or SERVER_FRAME_MAX
        if frame_max < FRAME_MIN_SIZE or frame_max > SERVER_FRAME_MAX:
            log.info("embedded broker: frame_max %s outside [%s, %s]", frame_max, FRAME_MIN_SIZE, SERVER_FRAME_MAX)
            self._abort()
            return
        self.channel_max = method.channel_max
        self.frame_max = frame_max
        self.heartbeat = method.heartbeat
        self.state = "open"
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if self.heartbeat:
            self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def _handshake_timeout(self) -> None:
        self._heartbeat_timer = None
        if self.state in ("header", "start", "tune", "open"):
            self._abort()

    def _heartbeat_tick(self) -> None:
        # Send every heartbeat/2 seconds; a peer silent for 2 intervals is dead.
        if self.state in ("closed",):
            return
        if self.loop.time() - self._last_recv > 2 * self.heartbeat:
            log.info("embedded broker: missed heartbeats from client %s, timeout: %ss", self.peer, self.heartbeat)
            self._abort()
            return
        self.write(framing.HEARTBEAT_FRAME)
        self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
