"""Publishing one partition in confirm mode with a window of outstanding confirms (``ConfirmWindow``).

A nack, a basic.return, a permanent refusal or a blocked connection fails the partition with an
``AmqpPublishError`` that says how many messages and why. A connection that lets the publisher
down in a way another may not — it ended with a transient fault, or no confirm came for
``confirmTimeout`` (a node cut off from its cluster keeps taking messages it cannot confirm) — is
replaced: the publisher connects again, trying the node it left after the uri's others, and
publishes the messages that connection did not confirm again (this sink is at least once; the
task's retry would publish the whole partition again). Connecting, before the first message or
after, is retried with backoff; an outage gives up after ``brokerOutageTimeout``, counted from when
it began and, in Spark's retry of the task, from when its write began: failing at once would spend
Spark's few task attempts within a second of a failover.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel
from ..errors import AmqpProtocolError, AmqpPublishError, AmqpReplyError, explain, is_transient
from ..transport.backoff import Backoff
from ..transport.endpoints import Endpoint
from ..transport.outage import Outage
from .columns import Outgoing
from .confirms import ConfirmWindow
from .options import SinkOptions

log = logging.getLogger("spark_amqp.sink")

T = TypeVar("T")
YIELD_EVERY = 256  # let the reader process confirms while a long batch is being sent


@dataclass
class PublishResult:
    published: int
    confirmed: int


class PartitionPublisher:
    def __init__(self, options: SinkOptions, retried_since: float | None = None) -> None:
        self.retried_since = retried_since  # in Spark's retry of the task: when its write began (Outage)
        self.options = options
        self.taken = 0  # messages taken from the partition so far

    async def publish(
        self,
        batches: Iterable[Iterable[Outgoing]],
        description: str,
        on_connect: Callable[[AmqpClient], Awaitable[None]] | None = None,
    ) -> PublishResult:
        """Publish every message; ``on_connect`` learns of each connection (and may ask the broker) before a
        message is built for it."""
        opts = self.options
        reconnects = Reconnects(opts, self.retried_since)
        source = self._taken_from(batches)
        last: Endpoint | None = None
        while True:
            client, channel = await self._ready(description, on_connect, reconnects.outage, last)
            window: ConfirmWindow[Outgoing] = ConfirmWindow(opts.max_in_flight, keep=True)
            try:
                await self._send(client, channel, window, source)
                return PublishResult(self.taken, self.taken)
            except LetDown as down:
                again = window.unanswered()
                source = itertools.chain(again, [down.unsent] if down.unsent is not None else [], source)
                delay = reconnects.after(down, bool(window.acked), len(again), client.last_heard)
                last = client.endpoint
            finally:
                await client.close()
            await asyncio.sleep(delay)

    def _taken_from(self, batches: Iterable[Iterable[Outgoing]]) -> Iterator[Outgoing]:
        for messages in batches:
            for message in messages:
                self.taken += 1
                yield message

    async def _send(self, client: AmqpClient, channel: ClientChannel, window: ConfirmWindow[Outgoing], source: Iterator[Outgoing]) -> None:
        """Publish what ``source`` gives and wait for every confirm; ``LetDown`` when the connection ended or
        stopped confirming (another may not), ``AmqpPublishError`` for anything else."""
        opts = self.options
        channel.on_confirm = window.on_confirm
        channel.on_return = window.on_return
        failed = asyncio.ensure_future(_first_failure(client, channel))
        try:
            message: Outgoing | None = None
            for message in source:
                if client.blocked is not None:
                    await self._wait_while_blocked(client, window, message)
                if not await window.wait_for_room(opts.confirm_timeout, failed):
                    raise self._timeout(window, message, client.blocked, unsent=message)
                self._raise_if_failed(failed, window, message, unsent=message)
                channel.publish(message.exchange, message.routing_key, opts.mandatory, message.header, message.body)
                window.sent(1, message)
                if window.published % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                self._raise_if_broken(window, message)
            if window.outstanding and not await window.wait_until_all_answered(opts.confirm_timeout, failed):
                raise self._timeout(window, message, client.blocked)
            self._raise_if_failed(failed, window, message)
            if message is not None:
                self._raise_if_broken(window, message)
        finally:
            failed.cancel()

    async def _ready(
        self,
        description: str,
        on_connect: Callable[[AmqpClient], Awaitable[None]] | None,
        outage: Outage,
        last: Endpoint | None,
    ) -> tuple[AmqpClient, ClientChannel]:
        """A connection (``last`` tried after the uri's other nodes) and a confirm channel, a transient failure waited
        out up to brokerOutageTimeout."""

        async def attempt() -> tuple[AmqpClient, ClientChannel]:
            client = await _connect(self.options, description, last, outage)
            try:
                if on_connect is not None:
                    await on_connect(client)
                return client, await self._open_channel(client)
            except BaseException:
                await client.close()
                raise

        return await patiently(self.options, attempt, self.retried_since, outage, self.taken)

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

    def _raise_if_broken(self, window: ConfirmWindow[Outgoing], message: Outgoing) -> None:
        if window.nacked or window.returned:
            raise self._rejected(window, message)

    def _raise_if_failed(
        self,
        failed: asyncio.Future[BaseException],
        window: ConfirmWindow[Outgoing],
        message: Outgoing | None,
        unsent: Outgoing | None = None,
    ) -> None:
        if failed.done() and not failed.cancelled():
            reason = failed.result()
            unconfirmed = window.published - window.acked
            scope = "channel" if isinstance(reason, AmqpReplyError) and not reason.closes_connection else "connection"
            what = (
                f"{unconfirmed} of {window.published} messages published to {_target(self.options, message)} are not confirmed: "
                f"the broker closed the {scope} ({reason})"
            )
            if is_transient(reason):
                raise LetDown(AmqpPublishError(what), unsent) from reason
            raise AmqpPublishError(f"{what}; {retry_hint(reason)}") from reason

    def _rejected(self, window: ConfirmWindow[Outgoing], message: Outgoing) -> AmqpPublishError:
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

    async def _wait_while_blocked(self, client: AmqpClient, window: ConfirmWindow[Outgoing], message: Outgoing) -> None:
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

    def _timeout(
        self, window: ConfirmWindow[Outgoing], message: Outgoing | None, blocked: str | None = None, unsent: Outgoing | None = None
    ) -> Exception:
        if blocked is not None:
            return AmqpPublishError(
                f"the broker blocked publishing (memory or disk alarm: {blocked}) for longer than confirmTimeout="
                f"{self.options.confirm_timeout:g}s; {window.outstanding} of {window.published} messages published to "
                f"{_target(self.options, message)} are not confirmed and nothing more was sent. The task fails so that Spark "
                "retries it; free memory or disk on the broker (rabbitmq-diagnostics alarms shows which)"
            )
        return LetDown(
            AmqpPublishError(
                f"{window.outstanding} of {window.published} messages published to {_target(self.options, message)} "
                f"got no confirm within confirmTimeout={self.options.confirm_timeout:g}s"
            ),
            unsent,
        )


class LetDown(Exception):
    """The connection ended, or stopped confirming: another may not. ``unsent``: what was taken but not published."""

    def __init__(self, error: AmqpPublishError, unsent: Any = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.unsent = unsent


class Reconnects:
    """How long a publisher goes on replacing connections that let it down (``LetDown``): ``brokerOutageTimeout``
    from the first such failure since a connection last confirmed something."""

    def __init__(self, opts: SinkOptions, retried_since: float | None) -> None:
        self.outage = Outage(opts.connection.outage_timeout, opts.connection.display_uri, retried_since)
        self._backoff = Backoff()

    def after(self, down: LetDown, confirmed: bool, again: int, heard: float | None = None) -> float:
        """How long to wait before connecting again, ``again`` messages to publish again; raises once the outage has
        lasted too long. ``confirmed``: the connection that let the publisher down had confirmed something; ``heard``:
        when it last heard from its broker."""
        outage = self.outage
        if confirmed:
            outage.recovered()
            self._backoff.reset()
        outage.failed(down.error, unreachable=False, heard=heard)
        delay = self._backoff.next()
        if not outage.allows(delay):
            raise AmqpPublishError(f"{down.error} ({outage.waited()}); the task fails so that Spark retries it") from down.__cause__
        log.warning(
            "AMQP sink: %s; connecting again in %.1fs, to another node of the uri if it names one, to publish those %d "
            "again (%.0fs of brokerOutageTimeout=%gs)",
            down.error,
            delay,
            again,
            outage.seconds(),
            outage.timeout,
        )
        return delay


async def _connect(opts: SinkOptions, description: str, last: Endpoint | None = None, outage: Outage | None = None) -> AmqpClient:
    connection = opts.connection if outage is None else outage.attempt_options(opts.connection)
    try:
        return await AmqpClient.connect(connection, f"spark-amqp sink {description}", last)
    except AmqpProtocolError as err:
        c = opts.connection
        raise AmqpPublishError(f"{explain(err, c.display_uri, c.username, c.vhost)}; {retry_hint(err)}") from err


async def patiently(
    opts: SinkOptions,
    attempt: Callable[[], Awaitable[T]],
    retried_since: float | None = None,
    outage: Outage | None = None,
    taken: int = 0,
) -> T:
    """``attempt`` again while it fails with an ``AmqpPublishError`` caused by a transient fault, for up to
    brokerOutageTimeout (counted, in Spark's retry of the task, from ``retried_since``: ``Outage``). Before the
    first message nothing is published, so trying again is safe; after (``taken`` messages, ``outage`` begun
    when the last connection let the publisher down), what was not confirmed is published again once connected."""
    backoff = Backoff()
    if outage is None:
        outage = Outage(opts.connection.outage_timeout, opts.connection.display_uri, retried_since)
    while True:
        began = time.monotonic()
        try:
            return await attempt()
        except AmqpPublishError as err:
            cause = err.__cause__
            if cause is None or not is_transient(cause):
                raise
            outage.failed(cause, tried=began)
            delay = backoff.next()
            if not outage.allows(delay):
                done = "nothing was published" if not taken else "the task fails so that Spark retries it"
                raise AmqpPublishError(f"{err} ({outage.waited()}); {done}") from cause
            log.warning(
                "AMQP sink: %s; trying again in %.1fs (attempt %d, %s; %.0fs of brokerOutageTimeout=%gs)",
                err,
                delay,
                backoff.failures,
                "nothing published yet" if not taken else f"{taken} messages taken, the unconfirmed ones to publish again",
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
