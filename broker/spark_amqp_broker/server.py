"""The broker server and ``EmbeddedBroker``, which runs it on a thread of its own.

The broker listens for AMQP 0-9-1 and AMQP 1.0 on one port (the protocol header chooses, as on
RabbitMQ 4.x: ``amqp10_connection``) and, on a port of its own, for RabbitMQ's stream protocol
(``stream_port``); all serve the same vhost, so a queue or a stream declared over one is read and
written over the others.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pamqp import commands

from spark_amqp import errors
from spark_amqp.rabbitmq import MAX_MESSAGE_SIZE_4X

from . import timeouts
from .amqp10_frames import condition_of
from .connection import BrokerConnection
from .faults import Faults
from .handshake import MODELLED_VERSION
from .vhost import VirtualHost

if TYPE_CHECKING:
    from .amqp10_connection import Amqp10Connection
    from .stream_port import StreamConnection

log = logging.getLogger("spark_amqp_broker")
T = TypeVar("T")
__all__ = ["MODELLED_VERSION", "BrokerServer", "EmbeddedBroker"]

DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000  # RabbitMQ's default


class BrokerServer:
    """State shared by all connections of one broker; lives on one event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        user: str = "guest",
        password: str = "guest",
        heartbeat: int = 60,
        consumer_timeout_ms: int | None = DEFAULT_CONSUMER_TIMEOUT_MS,
        max_message_size: int = MAX_MESSAGE_SIZE_4X,  # 4.x's default
        denied_features: frozenset[str] = frozenset(),
    ) -> None:
        self.loop = loop
        self.user = user
        self.password = password
        self.heartbeat = heartbeat
        self.consumer_timeout_ms = consumer_timeout_ms
        self.max_message_size = max_message_size
        self.vhost = VirtualHost(denied=denied_features)
        self.faults = Faults()
        self.connections: set[BrokerConnection] = set()
        self.ended: list[tuple[str, str]] = []  # (client connection_name, how it ended)
        self.stream_connections: set[StreamConnection] = set()
        self.amqp10_connections: set[Amqp10Connection] = set()  # AMQP 1.0 ones, on the AMQP port too
        self.stream_port = 0
        self.advertised_host = "localhost"  # the stream protocol's metadata names it as the leader of every stream
        self._server: asyncio.base_events.Server | None = None
        self._stream_server: asyncio.base_events.Server | None = None
        self._timeout_task: asyncio.Task[None] | None = None

    def authenticate(self, user: str, password: str) -> bool:
        return hmac.compare_digest(user.encode(), self.user.encode()) and hmac.compare_digest(password.encode(), self.password.encode())

    def anonymous_user(self) -> str | None:
        """Who an ANONYMOUS login is: RabbitMQ 4's anonymous_login_user, guest, when that user is this broker's."""
        return "guest" if self.user == "guest" else None

    def _new_connection(self) -> asyncio.Protocol:
        conn = BrokerConnection(self)
        if self.loop.time() < self.faults.refuse_until:
            return _Refuser()
        return conn

    async def start(self, host: str, port: int) -> int:
        self._server = await self.loop.create_server(self._new_connection, host, port, reuse_address=True, backlog=256)
        self._timeout_task = self.loop.create_task(self._consumer_timeout_loop())
        return int(self._server.sockets[0].getsockname()[1])

    async def start_stream(self, host: str, port: int) -> int:
        """Listen for the stream protocol too; the port (the one given, or the one picked for 0)."""
        from .stream_port import StreamConnection

        def new_connection() -> asyncio.Protocol:
            return _Refuser() if self.loop.time() < self.faults.refuse_until else StreamConnection(self)

        self._stream_server = await self.loop.create_server(new_connection, host, port, reuse_address=True, backlog=256)
        self.stream_port = int(self._stream_server.sockets[0].getsockname()[1])
        self.advertised_host = host if host not in ("", "0.0.0.0", "::") else "localhost"
        return self.stream_port

    async def stop(self) -> None:
        if self._timeout_task is not None:
            self._timeout_task.cancel()
        for listener in (self._server, self._stream_server):
            if listener is not None:
                listener.close()
        for conn in list(self.connections):
            conn.drop()
        for stream_conn in list(self.stream_connections):
            stream_conn.drop()
        for amqp10_conn in list(self.amqp10_connections):
            amqp10_conn.drop()
        for listener in (self._server, self._stream_server):
            if listener is not None:
                await listener.wait_closed()

    async def _consumer_timeout_loop(self) -> None:
        while True:
            await asyncio.sleep(timeouts.CHECK_INTERVAL)
            now = self.loop.time()
            for conn in list(self.connections):
                for ch in list(conn.channels.values()):
                    if ch.open and ch.unacked:
                        timeouts.expire(ch, now, self.consumer_timeout_ms)


class _Refuser(asyncio.Protocol):
    """Accepts and immediately closes: a broker that is not taking connections."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class EmbeddedBroker:
    """An in-memory AMQP 0-9-1 and AMQP 1.0 broker on its own event-loop thread, with RabbitMQ's stream protocol.

    >>> with EmbeddedBroker() as broker:
    ...     url = broker.url   # amqp://guest:guest@127.0.0.1:<port>/%2F
    ...     streams = broker.stream_url   # rabbitmq-stream://guest:guest@127.0.0.1:<stream port>/%2F

    Nothing is persisted: durable queues and persistent messages live only as
    long as the broker object.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        user: str = "guest",
        password: str = "guest",
        heartbeat: int = 60,
        consumer_timeout_ms: int | None = DEFAULT_CONSUMER_TIMEOUT_MS,
        max_message_size: int = MAX_MESSAGE_SIZE_4X,
        denied_features: tuple[str, ...] = (),
        stream_port: int = 0,
    ) -> None:
        """``denied_features``: deprecated features refused as an operator of RabbitMQ 4.x can deny them
        (``transient_nonexcl_queues``); ``global_qos`` is always denied, as on 4.3. ``stream_port``:
        where the stream protocol listens (0: a free port, read back from ``stream_port``)."""
        self.host = host
        self.port = port
        self.stream_port = stream_port
        self._user = user
        self._password = password
        self._settings = dict(
            heartbeat=heartbeat,
            consumer_timeout_ms=consumer_timeout_ms,
            max_message_size=max_message_size,
            denied_features=frozenset(denied_features),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: BrokerServer | None = None

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> EmbeddedBroker:
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._server = BrokerServer(loop, self._user, self._password, **self._settings)  # type: ignore[arg-type]
                self.port = loop.run_until_complete(self._server.start(self.host, self.port))
                self.stream_port = loop.run_until_complete(self._server.start_stream(self.host, self.stream_port))
            except BaseException as err:  # reported to the starting thread
                failure.append(err)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._server.stop())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"embedded-amqp-broker-{id(self):x}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        user = urllib.parse.quote(self._user, safe="")
        password = urllib.parse.quote(self._password, safe="")
        return f"amqp://{user}:{password}@{self.host}:{self.port}/%2F"

    @property
    def stream_url(self) -> str:
        """The stream protocol's url (``rabbitmq-stream://``), as ``url`` is AMQP 0-9-1's."""
        user = urllib.parse.quote(self._user, safe="")
        password = urllib.parse.quote(self._password, safe="")
        return f"rabbitmq-stream://{user}:{password}@{self.host}:{self.stream_port}/%2F"

    def call(self, fn: Callable[[BrokerServer], T], timeout: float = 10.0) -> T:
        """Run ``fn(server)`` on the broker's loop and return its result."""
        if self._loop is None or self._server is None:
            raise RuntimeError("the embedded broker is not running")
        server = self._server

        async def invoke() -> T:
            return fn(server)

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result(timeout)

    # -- settings and introspection ---------------------------------------------

    @property
    def consumer_timeout_ms(self) -> int | None:
        return self.call(lambda s: s.consumer_timeout_ms)

    @consumer_timeout_ms.setter
    def consumer_timeout_ms(self, value: int | None) -> None:
        def apply(s: BrokerServer) -> None:
            s.consumer_timeout_ms = value

        self.call(apply)

    def queue_stats(self, name: str) -> dict[str, int]:
        """Ready, unacked and consumer counts of a queue (KeyError if it does not exist)."""
        return self.call(lambda s: s.vhost.stats(name))

    def connection_count(self) -> int:
        return self.call(lambda s: len(s.connections))

    def amqp10_connection_count(self) -> int:
        """Open AMQP 1.0 connections (``connection_count`` counts AMQP 0-9-1 ones)."""
        return self.call(lambda s: len(s.amqp10_connections))

    def stream_connection_count(self) -> int:
        """Open stream-protocol connections (``connection_count`` counts AMQP 0-9-1 ones)."""
        return self.call(lambda s: len(s.stream_connections))

    def ended_connections(self) -> list[tuple[str, str]]:
        """(client connection_name, "closed by client" or "lost") for every connection that ended."""
        return self.call(lambda s: list(s.ended))

    # -- fault injection ------------------------------------------------------------

    def nack_next_publishes(self, count: int) -> None:
        """The next ``count`` publishes (any connection) are not enqueued and get basic.nack."""

        def apply(s: BrokerServer) -> None:
            s.faults.nack_publishes = count

        self.call(apply)

    def hold_confirms(self, seconds: float | None = None) -> None:
        """Withhold publisher confirms until ``release_confirms`` or for ``seconds``."""

        def apply(s: BrokerServer) -> None:
            s.faults.confirms_held = True
            if seconds is not None:
                s.loop.call_later(seconds, _release, s)

        self.call(apply)

    def release_confirms(self) -> None:
        self.call(_release)

    def raise_alarm(self, reason: str = "low on memory") -> None:
        """A memory or disk alarm, as RabbitMQ raises one: ``connection.blocked`` to every client that takes it
        (now and on connecting), and no publish confirmed until ``clear_alarm``; AMQP 1.0 publishers get no more
        credit until then."""

        def apply(s: BrokerServer) -> None:
            s.faults.alarm = reason
            s.faults.confirms_held = True
            for conn in s.connections:
                if conn.state == "running" and conn.client_capability("connection.blocked"):
                    conn.send_method(0, commands.Connection.Blocked(reason=reason))

        self.call(apply)

    def clear_alarm(self) -> None:
        def apply(s: BrokerServer) -> None:
            s.faults.alarm = None
            _release(s)
            for amqp10_conn in list(s.amqp10_connections):
                amqp10_conn.alarm_cleared()
            for conn in s.connections:
                if conn.state == "running" and conn.client_capability("connection.blocked"):
                    conn.send_method(0, commands.Connection.Unblocked())

        self.call(apply)

    def drop_connections(self, count: int | None = None, name_contains: str | None = None) -> int:
        """Abruptly cut ``count`` client connections (all when None), AMQP 0-9-1 ones first, then AMQP 1.0 ones, then
        stream-protocol ones, optionally only those whose client-provided ``connection_name`` (AMQP 1.0: the open's
        ``connection_name`` property) contains ``name_contains``; returns how many."""

        def apply(s: BrokerServer) -> int:
            amqp = sorted((c for c in s.connections if name_contains is None or name_contains in c.client_name), key=id)
            amqp10 = sorted((c for c in s.amqp10_connections if name_contains is None or name_contains in c.client_name), key=id)
            streams = sorted((c for c in s.stream_connections if name_contains is None or name_contains in c.client_name), key=id)
            victims: list[Any] = [*amqp, *amqp10, *streams]
            victims = victims if count is None else victims[:count]
            for conn in victims:
                conn.drop()
            return len(victims)

        return self.call(apply)

    def redeliver_unacked(self, queue: str) -> int:
        """Every delivery of ``queue`` not yet acknowledged is sent again on its channel, redelivered, as a quorum
        queue does after a partition of its consumers' node longer than its consumer-disconnected timeout; how many."""
        return self.call(lambda s: sum(ch.redeliver_unacked(queue) for c in s.connections for ch in list(c.channels.values()) if ch.open))

    def close_channels(self, reply_code: int, reply_text: str = "closed by fault injection", queue: str | None = None) -> int:
        """Close open channels with ``reply_code``: all of them, or those consuming from ``queue``."""

        def apply(s: BrokerServer) -> int:
            closed = 0
            for conn in list(s.connections):
                for ch in list(conn.channels.values()):
                    if queue is None or any(c.queue.name == queue for c in ch.consumers.values()):
                        conn.close_channel(ch, errors.reply_error(reply_code, reply_text))
                        closed += 1
            return closed

        return self.call(apply)

    def close_connections(self, reply_code: int, reply_text: str = "closed by fault injection", name_contains: str | None = None) -> int:
        """Close client connections with ``connection.close`` and ``reply_code`` (320 as a broker shutting down does)."""

        def apply(s: BrokerServer) -> int:
            victims = [c for c in s.connections if name_contains is None or name_contains in c.client_name]
            for conn in victims:
                conn.close_with(errors.reply_error(reply_code, reply_text, on_connection=True))
            others = [c for c in s.amqp10_connections if name_contains is None or name_contains in c.client_name]
            for other in others:  # AMQP 1.0: a close with the condition RabbitMQ gives for the code
                other.close_with(condition_of(errors.reply_error(reply_code, reply_text, on_connection=True)), reply_text)
            return len(victims) + len(others)

        return self.call(apply)

    def stall_opens(self, stalled: bool = True) -> None:
        """Log new clients in but never answer their ``connection.open`` (a broker hanging mid-handshake)."""

        def apply(s: BrokerServer) -> None:
            s.faults.stall_open = stalled

        self.call(apply)

    def refuse_stream_consumers(self, count: int) -> None:
        """The next ``count`` basic.consume on a stream (any connection) are refused as RabbitMQ refuses them while
        the node's replica restarts after a leader failover: 406 '... does not have a running replica on the local node'."""

        def apply(s: BrokerServer) -> None:
            s.faults.replica_down = count

        self.call(apply)

    def refuse_stream_publishers(self, count: int) -> None:
        """The next ``count`` stream-protocol publisher declarations get 0x06 "stream not available", as RabbitMQ
        answers while it elects a new leader for the stream."""

        def apply(s: BrokerServer) -> None:
            s.faults.leader_down = count

        self.call(apply)

    def refuse_connections(self, seconds: float) -> None:
        """New connections (either protocol) are accepted and closed at once for ``seconds``."""

        def apply(s: BrokerServer) -> None:
            s.faults.refuse_until = s.loop.time() + seconds

        self.call(apply)


def _release(server: BrokerServer) -> None:
    server.faults.confirms_held = False
    for conn in list(server.connections):
        conn.schedule_flush()
    for amqp10_conn in list(server.amqp10_connections):
        amqp10_conn.schedule_flush()
