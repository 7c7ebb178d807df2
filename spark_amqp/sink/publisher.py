"""Publishing one partition in confirm mode with a window of outstanding confirms.

Confirms are processed as they arrive (the socket's reader calls back into
``ConfirmWindow``); the publisher only waits when the window is full, and at
the end until every message it sent is confirmed. Anything but a broker ack for
every message — a nack, a basic.return, a closed channel or connection, or no
progress for ``confirmTimeout`` — fails the partition with an
``AmqpPublishError`` that says how many messages and why. Before the first message a transient
failure (no node answers, a node restarting, a queue's leader being elected) is waited out with
backoff for up to ``brokerOutageTimeout``: nothing has been published, so trying again is safe, and
failing at once would spend Spark's few task attempts within a second of a failover.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel
from ..errors import AmqpProtocolError, AmqpPublishError, AmqpReplyError, explain, is_transient
from ..transport.backoff import Backoff
from ..transport.outage import Outage
from .columns import Outgoing
from .options import SinkOptions

log = logging.getLogger("spark_amqp.sink")

T = TypeVar("T")
YIELD_EVERY = 256  # let the reader process confirms while a long batch is being sent


@dataclass
class PublishResult:
    published: int
    confirmed: int


class ConfirmWindow:
    """Counts published, acked and failed messages by publish sequence number."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.published = 0
        self.confirmed_up_to = 0  # every seq <= this has an answer
        self.acked = 0
        self.nacked = 0
        self.returned: list[tuple[int, str, str, str]] = []
        self._answered: set[int] = set()  # answered out of order (single confirms past a gap)
        self._room = asyncio.Event()
        self._room.set()

    @property
    def answered(self) -> int:
        """Messages the broker has acked or nacked so far."""
        return self.confirmed_up_to + len(self._answered)

    @property
    def outstanding(self) -> int:
        return self.published - self.answered

    def sent(self, count: int = 1) -> None:
        self.published += count
        if self.outstanding >= self.limit:
            self._room.clear()

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        if multiple:
            count = tag - self.confirmed_up_to - sum(1 for t in self._answered if t <= tag)
            self._answered = {t for t in self._answered if t > tag}
            self.confirmed_up_to = max(self.confirmed_up_to, tag)
        else:
            count = 1
            self._answered.add(tag)
            while self.confirmed_up_to + 1 in self._answered:
                self.confirmed_up_to += 1
                self._answered.discard(self.confirmed_up_to)
        if ack:
            self.acked += count
        else:
            self.nacked += count
        if self.outstanding < self.limit:
            self._room.set()

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.returned.append((code, text, exchange, routing_key))

    async def wait_for_room(self, timeout: float, failed: asyncio.Future[BaseException]) -> bool:
        """True when there is room; False when ``timeout`` passed without any confirm."""
        while not self._room.is_set():
            before = self.answered
            waiter: asyncio.Future[Any] = asyncio.ensure_future(self._room.wait())
            done, _ = await asyncio.wait([waiter, failed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if failed in done:
                return True  # the caller sees the failure
            if not done and self.answered == before:
                return False
        return True

    async def wait_until_all_answered(self, timeout: float, failed: asyncio.Future[BaseException]) -> bool:
        """True when every message is answered (or ``failed`` fired); False after ``timeout`` without progress."""
        loop = asyncio.get_running_loop()
        before = self.answered
        deadline = loop.time() + timeout
        while self.outstanding and not failed.done():
            await asyncio.sleep(0.005)
            if self.answered != before:
                before = self.answered
                deadline = loop.time() + timeout
            elif loop.time() > deadline:
                return False
        return True


class PartitionPublisher:
    def __init__(self, options: SinkOptions, retried_since: float | None = None) -> None:
        self.retried_since = retried_since  # in Spark's retry of the task: when its write began (Outage)
        self.options = options

    async def publish(
        self,
        batches: Iterable[Iterable[Outgoing]],
        description: str,
        on_connect: Callable[[AmqpClient], Awaitable[None]] | None = None,
    ) -> PublishResult:
        """Publish every message; ``on_connect`` learns of the connection (and may ask the broker) before the
        first batch is built."""
        opts = self.options
        client, channel = await self._ready(description, on_connect)
        window = ConfirmWindow(opts.max_in_flight)
        failed: asyncio.Future[BaseException] | None = None
        try:
            channel.on_confirm = window.on_confirm
            channel.on_return = window.on_return
            failed = asyncio.ensure_future(_first_failure(client, channel))
            last: Outgoing | None = None
            for messages in batches:
                for message in messages:
                    if client.blocked is not None:
                        await self._wait_while_blocked(client, window, message)
                    if not await window.wait_for_room(opts.confirm_timeout, failed):
                        raise self._timeout(window, message, client.blocked)
                    self._raise_if_failed(failed, window, message)
                    channel.publish(message.exchange, message.routing_key, opts.mandatory, message.header, message.body)
                    window.sent()
                    last = message
                    if window.published % YIELD_EVERY == 0:
                        await asyncio.sleep(0)
                    self._raise_if_broken(window, message)
            if window.outstanding and not await window.wait_until_all_answered(opts.confirm_timeout, failed):
                raise self._timeout(window, last, client.blocked)
            self._raise_if_failed(failed, window, last)
            if last is not None:
                self._raise_if_broken(window, last)
            return PublishResult(window.published, window.acked)
        finally:
            if failed is not None:
                failed.cancel()
            await client.close()

    async def _ready(
        self, description: str, on_connect: Callable[[AmqpClient], Awaitable[None]] | None
    ) -> tuple[AmqpClient, ClientChannel]:
        """A connection and a confirm channel, a transient failure waited out up to brokerOutageTimeout."""

        async def attempt() -> tuple[AmqpClient, ClientChannel]:
            client = await _connect(self.options, description)
            try:
                if on_connect is not None:
                    await on_connect(client)
                return client, await self._open_channel(client)
            except BaseException:
                await client.close()
                raise

        return await patiently(self.options, attempt, self.retried_since)

    async def _open_channel(self, client: AmqpClient) -> ClientChannel:
        """A channel in confirm mode, after any declarations asked for; a refusal names what was refused."""
        opts = self.options
        subject = f"queue '{opts.declare_queue}'" if opts.declare_queue else f"exchange '{opts.exchange}'"
        try:
            channel = await client.channel()
            await self._declare(channel)
            await channel.rpc(commands.Confirm.Select())
        except AmqpProtocolError as err:
            c = opts.connection
            raise AmqpPublishError(f"{explain(err, c.display_uri, c.username, c.vhost, subject)}; {retry_hint(err)}") from err
        return channel

    async def _declare(self, channel: ClientChannel) -> None:
        opts = self.options
        if opts.declare_exchange:
            await channel.rpc(
                framing.build(
                    commands.Exchange.Declare, exchange=opts.exchange, exchange_type=opts.declare_exchange, durable=opts.exchange_durable
                )
            )
        if opts.declare_queue:
            await channel.rpc(
                framing.build(commands.Queue.Declare, queue=opts.declare_queue, durable=True, arguments=opts.queue_arguments or None)
            )
            if opts.exchange:
                await channel.rpc(
                    framing.build(commands.Queue.Bind, queue=opts.declare_queue, exchange=opts.exchange, routing_key=opts.binding_key)
                )

    def _raise_if_broken(self, window: ConfirmWindow, message: Outgoing) -> None:
        if window.nacked or window.returned:
            raise self._rejected(window, message)

    def _raise_if_failed(self, failed: asyncio.Future[BaseException], window: ConfirmWindow, message: Outgoing | None) -> None:
        if failed.done() and not failed.cancelled():
            reason = failed.result()
            unconfirmed = window.published - window.acked
            scope = "channel" if isinstance(reason, AmqpReplyError) and not reason.closes_connection else "connection"
            raise AmqpPublishError(
                f"{unconfirmed} of {window.published} messages published to {_target(self.options, message)} are not confirmed: "
                f"the broker closed the {scope} ({reason}); {retry_hint(reason)}"
            ) from reason

    def _rejected(self, window: ConfirmWindow, message: Outgoing) -> AmqpPublishError:
        parts = []
        if window.nacked:
            parts.append(f"{window.nacked} nacked by the broker (a full queue with x-overflow=reject-publish, or a broker failure)")
        if window.returned:
            code, text, exchange, key = window.returned[0]
            parts.append(
                f"{len(window.returned)} returned as unroutable ({code} {text}; first: exchange '{exchange}', routing key '{key}'; mandatory=true)"
            )
        return AmqpPublishError(
            f"{' and '.join(parts)} of {window.published} messages published to {_target(self.options, message)} "
            f"({window.acked} confirmed so far); the task fails so that Spark retries it"
        )

    async def _wait_while_blocked(self, client: AmqpClient, window: ConfirmWindow, message: Outgoing) -> None:
        """connection.blocked: RabbitMQ stops reading from a publisher under a memory or disk alarm. Publish
        nothing more until it unblocks, for up to confirmTimeout, then fail saying why."""
        reason = client.blocked
        log.warning(
            "AMQP sink: the broker blocked publishing (%s: a memory or disk alarm); waiting up to confirmTimeout=%gs",
            reason,
            self.options.confirm_timeout,
        )
        try:
            await asyncio.wait_for(client.unblocked.wait(), self.options.confirm_timeout)
        except TimeoutError:
            raise self._timeout(window, message, reason) from None
        log.warning("AMQP sink: the broker unblocked publishing")

    def _timeout(self, window: ConfirmWindow, message: Outgoing | None, blocked: str | None = None) -> AmqpPublishError:
        if blocked is not None:
            return AmqpPublishError(
                f"the broker blocked publishing (memory or disk alarm: {blocked}) for longer than confirmTimeout="
                f"{self.options.confirm_timeout:g}s; {window.outstanding} of {window.published} messages published to "
                f"{_target(self.options, message)} are not confirmed and nothing more was sent. The task fails so that Spark "
                "retries it; free memory or disk on the broker (rabbitmq-diagnostics alarms shows which)"
            )
        return AmqpPublishError(
            f"{window.outstanding} of {window.published} messages published to {_target(self.options, message)} "
            f"got no confirm within confirmTimeout={self.options.confirm_timeout:g}s; the task fails so that Spark retries it"
        )


async def _connect(opts: SinkOptions, description: str) -> AmqpClient:
    try:
        return await AmqpClient.connect(opts.connection, f"spark-amqp sink {description}")
    except AmqpProtocolError as err:
        c = opts.connection
        raise AmqpPublishError(f"{explain(err, c.display_uri, c.username, c.vhost)}; {retry_hint(err)}") from err


async def patiently(opts: SinkOptions, attempt: Callable[[], Awaitable[T]], retried_since: float | None = None) -> T:
    """``attempt`` again while it fails with an ``AmqpPublishError`` caused by a transient fault, for up to
    brokerOutageTimeout (counted, in Spark's retry of the task, from ``retried_since``: ``Outage``): nothing is
    published before it succeeds, so trying again is safe."""
    backoff = Backoff()
    outage = Outage(opts.connection.outage_timeout, opts.connection.display_uri, retried_since)
    while True:
        try:
            return await attempt()
        except AmqpPublishError as err:
            cause = err.__cause__
            if cause is None or not is_transient(cause):
                raise
            outage.failed(cause)
            delay = backoff.next()
            if not outage.allows(delay):
                raise AmqpPublishError(f"{err} ({outage.waited()}); nothing was published") from cause
            log.warning(
                "AMQP sink: %s; trying again in %.1fs (attempt %d, nothing published yet; %.0fs of brokerOutageTimeout=%gs)",
                err,
                delay,
                backoff.failures,
                outage.seconds(),
                outage.timeout,
            )
            await asyncio.sleep(delay)


def retry_hint(err: BaseException) -> str:
    if is_transient(err):
        return "the task fails so that Spark retries it"
    return "this is not transient: retrying the task fails the same way until the cause is fixed"


async def _first_failure(client: AmqpClient, channel: ClientChannel) -> BaseException:
    reason = await asyncio.shield(channel.closed)
    if reason is None:
        reason = await asyncio.shield(client.closed)
    return reason


def _target(opts: SinkOptions, message: Outgoing | None) -> str:
    if message is None:
        return f"exchange '{opts.exchange}'"
    exchange = message.exchange[1:].decode("utf-8")
    key = message.routing_key[1:].decode("utf-8")
    return f"exchange '{exchange}' with routing key '{key}'"
