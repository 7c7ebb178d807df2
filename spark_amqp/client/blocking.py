"""``BlockingClient``: one client connection on a background event-loop thread, for callers that are not async.

Spark's source runner calls the reader synchronously; planning a stream batch
asks the broker a few short questions. This keeps one connection for them,
opens it on first use and again after it is lost, and retries transient
failures until ``connectionTimeout`` (then ``BrokerUnreachable``: the caller
decides whether to wait longer) while a permanent refusal fails at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from ..errors import AmqpSourceError, BrokerUnreachable, ConnectionLost, explain, is_transient
from ..transport.backoff import Backoff
from ..transport.options import ConnectionOptions

__all__ = ["BlockingClient"]

log = logging.getLogger("spark_amqp.client")
T = TypeVar("T")


class Connection(Protocol):
    """What both clients (``AmqpClient``, ``StreamClient``) offer for this."""

    closed: asyncio.Future[Any]

    @property
    def last_heard(self) -> float: ...

    async def close(self) -> None: ...

    def abort(self, reason: Any) -> None: ...


C = TypeVar("C", bound=Connection)


class BlockingClient(Generic[C]):
    """``connect``: how a connection is opened (``AmqpClient.connect`` or ``StreamClient.connect``)."""

    def __init__(self, options: ConnectionOptions, client_name: str, connect: Callable[[ConnectionOptions, str], Awaitable[C]]) -> None:
        self.options = options
        self.client_name = client_name
        self._connect = connect
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: C | None = None
        # After a failure: when the connection it dropped had last heard from its broker, or with none, when the failed
        # attempt began (monotonic): an outage that failure opens began then (``Outage.failed``).
        self.heard: float | None = None
        self.tried: float | None = None
        self.answers = 0  # calls the broker answered: a caller's outage ends only with one

    def run(self, call: Callable[[C], Awaitable[T]], subject: str, retry_for: float | None = None) -> T:
        """``call(client)`` on the loop thread; ``subject`` names what is asked about in errors (e.g. "stream 'events'").
        Transient failures are retried for ``retry_for`` seconds (default ``connectionTimeout``; 0: one attempt)."""
        options = self.options
        deadline = time.monotonic() + (options.connection_timeout if retry_for is None else retry_for)
        backoff = Backoff(cap=5.0)
        while True:
            began = time.monotonic()
            try:
                answer = self._submit(call)
                self.answers += 1
                return answer
            except Exception as err:
                client = self._client
                self.heard, self.tried = (client.last_heard, None) if client is not None else (None, began)
                self._drop()
                if isinstance(err, AmqpSourceError):
                    raise
                explained = explain(err, options.display_uri, options.username, options.vhost, subject)
                if not is_transient(err):
                    raise AmqpSourceError(explained) from err
                delay = backoff.next()
                if time.monotonic() + delay >= deadline:
                    raise BrokerUnreachable(explained) from err
                log.warning("AMQP: %s: %s; retrying", subject, err)
                time.sleep(delay)

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._client is not None:
            client, self._client = self._client, None
            try:
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(5.0)
            except Exception as err:  # closing anyway; nothing was in flight
                log.debug("AMQP: close: %s", err)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5.0)
            if not self._thread.is_alive():
                loop.close()  # else the garbage collector closes it later, on a self-pipe that may be gone
        self._loop = self._thread = None

    def _submit(self, call: Callable[[C], Awaitable[T]]) -> T:
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(self._with_client(call), loop)
        # The client's own calls time out after connectionTimeout, connecting after a round over the
        # endpoints; this is a backstop.
        backstop = self.options.round_timeout + 2 * self.options.connection_timeout + 5.0
        try:
            return future.result(backstop)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ConnectionLost(f"no answer within {backstop:g}s") from None

    async def _with_client(self, call: Callable[[C], Awaitable[T]]) -> T:
        client = self._client
        if client is None or client.closed.done():
            client = await self._connect(self.options, self.client_name)
            self._client = client
        return await call(client)

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(client.abort, ConnectionLost("dropped after a failure"))

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"{self.client_name} I/O", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop
