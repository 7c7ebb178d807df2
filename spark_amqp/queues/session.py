"""``ConsumerSession``: the source runner's one connection, on a background I/O thread.

One channel per queue, manual acks, a per-consumer prefetch. The I/O thread
runs an asyncio loop that owns the socket (``AmqpClient``); the runner thread
talks to it only through ``inbox`` (deliveries and events, in order) and
``ack`` (scheduled onto the loop). A channel or connection that dies is
reopened with backoff under a new session id, so a delivery tag is only ever
acknowledged on the channel that delivered it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel, LazyProperties, queue_stats, stats_of
from ..errors import AmqpProtocolError, AmqpReplyError, AmqpSourceError, NotFound, OtherConsumers, StreamInQueueMode, explain, is_transient
from ..reading.stream_consumers import is_stream
from ..transport.backoff import Backoff
from ..transport.outage import BrokerOutage, Outage
from .channel_policy import ChannelPolicy
from .inbox import AckConfirmed, Delivery, SessionClosed
from .options import SourceOptions

log = logging.getLogger("spark_amqp.queues")
T = TypeVar("T")


class _Consumer:
    """One queue's channel and subscription."""

    def __init__(self, channel: ClientChannel, session: str, queue: str) -> None:
        self.channel = channel
        self.session = session
        self.queue = queue
        self.tag = ""


class ConsumerSession:
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
        self._client: AmqpClient | None = None
        self._consumers: dict[str, _Consumer] = {}  # session id -> consumer
        self._consuming: set[str] = set()
        self._policy = ChannelPolicy(options)
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
        if self.fatal is None and not self._stopping and self._thread is not None and not self._thread.is_alive():
            self.fatal = AmqpSourceError("the AMQP consumer thread ended unexpectedly")
        if self.fatal is None and self._started.is_set():
            try:
                self.outage.check()  # a broker gone this long is an error, not an idle queue
            except BrokerOutage as err:
                self.fatal = err
        if self.fatal is not None:
            raise self.fatal

    def ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        """On ``session``'s channel, if it is still alive: a multi-ack up to ``multiple`` and single acks of
        ``singles``; then ``AckConfirmed(session, ack_round)`` once a synchronous reply proves them."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._ack, session, multiple, singles, ack_round)

    def pause(self, timeout: float = 10.0) -> None:
        """Cancel every consumer and wait for the broker's cancel-ok: after this, nothing more arrives."""
        self._call(self._cancel_all, timeout)

    def resume(self, timeout: float = 10.0) -> None:
        self._call(self._consume_all, timeout)

    def ready_counts(self, timeout: float) -> dict[str, int]:
        """Messages ready on the broker per queue: passive declares on the consumer's own connection."""
        return self._call(self._ready_counts, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Close channels cleanly so unacked deliveries go back to their queues at once."""
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._main is not None and not self._main.done():
            try:
                self._call(self._shutdown, timeout)
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
                client = await AmqpClient.connect(connection, f"spark-amqp source {self.run_id}")
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
            tasks = [self._supervised(self._consume_queue(client, q)) for q in self.options.queues]
            reason = await client.closed
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for consumer in list(self._consumers.values()):
                self._session_lost(consumer, f"connection lost: {reason}")
            self._client = None
            if self._stopping or self.fatal is not None:
                return
            if not is_transient(reason):
                self.fatal = self._error(reason)
                return
            self._last_error = str(reason)
            self.outage.failed(reason)
            log.warning("AMQP source: connection to %s lost (%s); reconnecting", connection.display_uri, reason)
            await asyncio.sleep(backoff.next())

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
            self._client.abort(_Stopped("consumer failed"))

    def _error(self, err: BaseException, queue: str = "") -> AmqpSourceError:
        c = self.options.connection
        error = AmqpSourceError(explain(err, c.display_uri, c.username, c.vhost, f"queue '{queue}'" if queue else ""))
        error.__cause__ = err
        return error

    async def _consume_queue(self, client: AmqpClient, queue: str) -> None:
        backoff = Backoff()
        while not self._stopping and self.fatal is None and not client.closed.done():
            try:
                channel = await client.channel()
            except AmqpProtocolError:
                return  # the connection is going: _run decides what next
            self._epoch += 1
            consumer = _Consumer(channel, f"{self.run_id}.{self._epoch}", queue)
            self._consumers[consumer.session] = consumer
            reason: AmqpProtocolError | None
            try:
                await self._subscribe(consumer)
                backoff.reset()
                reason = await channel.closed
            except AmqpReplyError as err:
                reason = err
            except OtherConsumers as err:
                reason = err
                await self._release(consumer)
            except StreamInQueueMode as err:  # before basic.consume: nothing to give back
                reason = err
                await channel.close()
            except AmqpProtocolError:
                return
            self._session_lost(consumer, str(reason) if reason is not None else "closed")
            if isinstance(reason, AmqpReplyError | OtherConsumers | StreamInQueueMode) and self._on_channel_error(queue, reason):
                return
            await asyncio.sleep(backoff.next())

    async def _subscribe(self, consumer: _Consumer) -> None:
        channel, queue = consumer.channel, consumer.queue
        decl = self.options.declaration
        if decl is not None:
            await channel.rpc(framing.build(commands.Queue.Declare, queue=queue, durable=decl.durable, arguments=decl.arguments or None))
            if decl.exchange:
                await channel.rpc(framing.build(commands.Queue.Bind, queue=queue, exchange=decl.exchange, routing_key=decl.binding_key))
        if await is_stream(channel.client, queue):
            raise StreamInQueueMode(queue)
        await channel.rpc(commands.Basic.Qos(prefetch_count=self.options.prefetch))
        inbox, session = self.inbox, consumer.session
        make = tuple.__new__  # a Delivery without NamedTuple's Python-level __new__: half the cost, per message

        def on_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: LazyProperties, body: bytes) -> None:
            inbox.append(make(Delivery, (session, queue, tag, redelivered, exchange, routing_key, props, body)))

        def on_first_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: LazyProperties, body: bytes) -> None:
            # The queue may have been deleted and declared again as a stream since the check above; a
            # message copied out of a stream carries the header too, so ask the broker again.
            channel.on_delivery = on_delivery
            if props.long_header("x-stream-offset") is not None:
                self._background(self._check_not_stream(consumer))
            on_delivery(tag, redelivered, exchange, routing_key, props, body)

        def on_cancel(tag: str) -> None:
            self._background(self._cancelled(consumer))

        channel.on_delivery = on_first_delivery
        channel.on_cancel = on_cancel
        await self._basic_consume(consumer)
        self._consuming.add(queue)
        if self._consuming >= set(self.options.queues):
            self._started.set()

    async def _basic_consume(self, consumer: _Consumer) -> None:
        # The tag names the host and the query run: what `rabbitmqctl list_consumers` shows of us.
        tag = f"spark-amqp-{socket.gethostname()}-{consumer.session}"
        ok = await consumer.channel.rpc(
            framing.build(commands.Basic.Consume, queue=consumer.queue, consumer_tag=tag, exclusive=self.options.exclusive_consumer)
        )
        consumer.tag = ok.consumer_tag
        if self.options.exclusive_consumer:
            # Quorum queues take a second consumer however exclusive the first: count them. RabbitMQ
            # applies a quorum queue's checkout before its consume-ok, so the count includes ours.
            consumers = (await stats_of(consumer.channel, consumer.queue)).consumers
            if consumers > 1:
                raise OtherConsumers(consumer.queue, consumers)
        self._policy.subscribed(consumer.queue)

    async def _check_not_stream(self, consumer: _Consumer) -> None:
        try:
            stream = await is_stream(consumer.channel.client, consumer.queue)
        except AmqpProtocolError:
            return  # the connection went: subscribing again checks the queue's type first
        if stream:
            self._on_channel_error(consumer.queue, StreamInQueueMode(consumer.queue))

    async def _cancelled(self, consumer: _Consumer) -> None:
        """The broker cancelled our consumer (basic.cancel) and left its channel open: say why, then
        give its deliveries back and subscribe again on a new channel (or find the queue gone)."""
        channel, queue = consumer.channel, consumer.queue
        try:
            # 4.3 feeds a timed-out consumer again once its deliveries are settled: cancel it ourselves.
            await channel.give_back(consumer.tag)
            await stats_of(channel, queue)
        except NotFound:
            log.warning("AMQP source: the broker cancelled the consumer of queue '%s': the queue was deleted", queue)
            return  # the 404 closed the channel; subscribing again reports the missing queue
        except AmqpProtocolError:
            pass  # the channel or connection went anyway; what follows says why
        else:
            log.warning(
                "AMQP source: the broker cancelled the consumer of queue '%s' although the queue still exists. RabbitMQ 4.3 "
                "does this when a delivery waited longer than the quorum queue's consumer timeout (x-consumer-timeout, "
                "consumer_timeout: 30 min by default), as batches wait for Spark's commit; it also happens when a queue "
                "replica takes over. Nothing is lost: the deliveries go back to the queue and are recognised when they come "
                "again. Subscribing again; raise the consumer timeout if this repeats.",
                queue,
            )
        await channel.close()

    async def _release(self, consumer: _Consumer) -> None:
        """Give the channel's unacked deliveries back (not a counted return on 4.3) and close it."""
        try:
            await consumer.channel.give_back(consumer.tag)
        except AmqpProtocolError:
            pass  # the channel went anyway: its deliveries are back in the queue
        await consumer.channel.close()

    def _on_channel_error(self, queue: str, reason: AmqpProtocolError) -> bool:
        """True when the channel's close is fatal for the query (then the query fails with why)."""
        message = self._policy.failure(queue, reason)
        if message is None:
            return False
        self.fatal = AmqpSourceError(message)
        self.fatal.__cause__ = reason
        if self._client is not None:
            self._background(self._client.close())
        return True

    def _session_lost(self, consumer: _Consumer, reason: str) -> None:
        if self._consumers.pop(consumer.session, None) is not None:
            self._consuming.discard(consumer.queue)
            self.inbox.append(SessionClosed(consumer.session, consumer.queue, reason))

    def _ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        consumer = self._consumers.get(session)
        if consumer is None or not consumer.channel.is_open:
            return
        if multiple is not None:
            consumer.channel.ack(multiple, True)
        for tag in singles:
            consumer.channel.ack(tag, False)
        self._background(self._prove_ack(consumer, ack_round))

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prove_ack(self, consumer: _Consumer, ack_round: int) -> None:
        # basic.qos is synchronous: its reply proves the ack before it was processed.
        try:
            await consumer.channel.rpc(commands.Basic.Qos(prefetch_count=self.options.prefetch))
        except AmqpProtocolError:
            return  # the channel is gone: its deliveries come back, and the ledger knows the ack is unproven
        self.inbox.append(AckConfirmed(consumer.session, ack_round))

    async def _ready_counts(self) -> dict[str, int]:
        client = self._client
        if client is None or client.closed.done():
            raise AmqpSourceError(f"not connected to {self.options.connection.display_uri} (reconnecting)")
        stats = await queue_stats(client, self.options.queues)
        for queue, counted in stats.items():
            self._policy.counted(queue, counted.consumers)
        return {q: s.ready for q, s in stats.items()}

    async def _cancel_all(self) -> None:
        for consumer in list(self._consumers.values()):
            if consumer.channel.is_open and consumer.tag:
                await consumer.channel.rpc(commands.Basic.Cancel(consumer_tag=consumer.tag))

    async def _consume_all(self) -> None:
        for consumer in list(self._consumers.values()):
            if consumer.channel.is_open:
                await self._basic_consume(consumer)

    async def _shutdown(self) -> None:
        client = self._client
        if client is not None:
            # Unacked deliveries go back as nacks (a closed channel would count as a return
            # towards a quorum queue's delivery-limit on RabbitMQ 4.3), then one
            # connection.close: quick, and Spark does not wait long.
            await asyncio.gather(*(c.channel.give_back(c.tag) for c in self._consumers.values() if c.tag), return_exceptions=True)
            await client.close()
        if self._main is not None:
            self._main.cancel()


class _Stopped(AmqpProtocolError):
    """Why the consumer's own connection was dropped after a failure (never retried)."""
