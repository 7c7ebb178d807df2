"""``IoSession``: the source runner's one connection, on a background I/O thread, whichever protocol it speaks.

The I/O thread runs an asyncio loop that owns the socket; the runner thread talks to it only through
``inbox`` (deliveries and events, in order) and calls scheduled onto the loop. A connection that ends is
made again with backoff until ``brokerOutageTimeout``; a permanent refusal fails the query at once. What
is read on a connection, and how deliveries are settled, is the protocol's: ``ConsumerSession`` (AMQP
0-9-1 channels) and ``Amqp10Session`` (AMQP 1.0 links) fill in ``_serve``, ``_lost_all`` and ``_shutdown``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import AmqpProtocolError, AmqpSourceError, explain, is_transient
from ..transport.backoff import Backoff
from ..transport.connection import Connection
from ..transport.outage import BrokerOutage, Outage
from .inbox import AckConfirmed, Delivery, SessionClosed
from .options import SourceOptions

log = logging.getLogger("spark_amqp.queues")
T = TypeVar("T")


class IoSession:
    client_class: type[Connection]
    marks_redeliveries = True  # the broker flags a redelivered message (else Intake checks every delivery)

    def __init__(self, options: SourceOptions, run_id: str) -> None:
        self.options = options
        self.run_id = run_id
        self.inbox: deque[Delivery | SessionClosed | AckConfirmed] = deque()
        self.fatal: AmqpSourceError | None = None
        self._epoch = 0
        self._stopping = False
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._consuming: set[str] = set()
        self._last_error = ""
        self.outage = Outage(options.connection.outage_timeout, options.connection.display_uri)
        self.server_version: tuple[int, int] | None = None  # the broker's, once connected
        self._main: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    # -- runner-thread API ------------------------------------------------

    def start(self) -> None:
        """Connect and start consuming every queue; raise a clear error if that cannot work."""
        if self._thread is None:
            ready = threading.Event()
            self._thread = threading.Thread(target=self._thread_main, args=(ready,), name="amqp-source-io", daemon=True)
            self._thread.start()
            ready.wait()
        timeout = self.options.connection.round_timeout + 5  # one round over the endpoints, each may be silent
        if not self._started.wait(timeout):
            self.check()
            raise AmqpSourceError(
                f"could not start consuming {', '.join(self.options.queues)} from "
                f"{self.options.connection.display_uri} within {timeout:.0f}s: {self._last_error or 'no answer'}"
            )
        self.check()

    def check(self) -> None:
        # Whether the thread is over first, then what it left: read the other way round, a thread that set fatal and
        # ended between the two reads had its error replaced by this one (ci73, Python 3.13).
        thread = self._thread
        if thread is not None and not thread.is_alive() and self.fatal is None and not self._stopping:
            self.fatal = AmqpSourceError("the AMQP consumer thread ended unexpectedly")
        if self.fatal is None and self._started.is_set():
            try:
                self.outage.check()  # a broker gone this long is an error, not an idle queue
            except BrokerOutage as err:
                self.fatal = err
        if self.fatal is not None:
            raise self.fatal

    def stop(self, timeout: float = 5.0) -> None:
        """Give unsettled deliveries back at once and close the connection."""
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._main is not None and not self._main.done():
            try:
                self._call(self._stop, timeout)
            except (AmqpSourceError, RuntimeError):
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _call(self, fn: Callable[[], Awaitable[T]], timeout: float) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise AmqpSourceError("the consumer is not running")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(fn(), loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise AmqpSourceError(f"{self.options.connection.display_uri} did not answer within {timeout:.0f}s") from None
        except AmqpProtocolError as err:
            raise self._error(err) from err

    # -- I/O thread -------------------------------------------------------------

    def _thread_main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._main = loop.create_task(self._run())
        ready.set()
        try:
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        except BaseException as err:  # a bug must fail the query with its cause, never leave it waiting
            self._crashed(err)
        finally:
            self._started.set()  # unblock a waiting start(); check() reports why
            loop.close()

    async def _run(self) -> None:
        backoff = Backoff()
        connection = self.options.connection
        while not self._stopping and self.fatal is None:
            try:
                client = await self.client_class.connect(connection, f"spark-amqp source {self.run_id}")
            except Exception as err:
                if not is_transient(err):
                    self.fatal = self._error(err)
                    return
                self._last_error = str(err)
                self.outage.failed(err)
                delay = backoff.next()
                log.warning(
                    "AMQP source: cannot connect to %s (%s); retrying in %.1fs (no answer for %.0fs of brokerOutageTimeout=%gs)",
                    connection.display_uri,
                    err,
                    delay,
                    self.outage.seconds(),
                    self.outage.timeout,
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self.outage.recovered()
            self._client = client
            self.server_version = client.server_version
            tasks = [self._supervised(self._serve(client, q)) for q in self.options.queues]
            reason = await client.closed
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._lost_all(f"connection lost: {reason}")
            self._client = None
            if self._stopping or self.fatal is not None:
                return
            if not is_transient(reason):
                self.fatal = self._error(reason)
                return
            self._last_error = str(reason)
            self.outage.failed(reason, heard=client.last_heard)
            log.warning("AMQP source: connection to %s lost (%s); reconnecting", connection.display_uri, reason)
            await asyncio.sleep(backoff.next())

    async def _serve(self, client: Any, queue: str) -> None:
        """Read ``queue`` on ``client`` until the connection ends (subscribing again when the broker ends a subscription)."""
        raise NotImplementedError

    def _lost_all(self, reason: str) -> None:
        """The connection ended: every subscription's session is over (``SessionClosed`` for each)."""
        raise NotImplementedError

    async def _stop(self) -> None:
        """Give every unsettled delivery back, close the connection and end the I/O loop."""
        raise NotImplementedError

    def _subscribed(self, queue: str) -> None:
        self._consuming.add(queue)
        if self._consuming >= set(self.options.queues):
            self._started.set()

    def _supervised(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """A task whose unexpected exception fails the query (never a silent, dead consumer)."""
        task = asyncio.ensure_future(coro)

        def done(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                self._crashed(t.exception())  # type: ignore[arg-type]

        task.add_done_callback(done)
        return task

    def _crashed(self, err: BaseException) -> None:
        log.error("AMQP source: the consumer failed unexpectedly", exc_info=err)
        if self.fatal is None:
            fatal = AmqpSourceError(f"the AMQP consumer failed unexpectedly: {type(err).__name__}: {err}")
            fatal.__cause__ = err
            self.fatal = fatal
        if self._client is not None and not self._client.closed.done():
            self._client.abort(Stopped("consumer failed"))

    def _error(self, err: BaseException, queue: str = "") -> AmqpSourceError:
        c = self.options.connection
        error = AmqpSourceError(explain(err, c.display_uri, c.username, c.vhost, f"queue '{queue}'" if queue else ""))
        error.__cause__ = err
        return error

    def _fail(self, error: AmqpSourceError) -> None:
        """Fail the query with ``error`` and close the connection."""
        self.fatal = error
        if self._client is not None:
            self._background(self._client.close())

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class Stopped(AmqpProtocolError):
    """Why the consumer's own connection was dropped after a failure (never retried)."""
