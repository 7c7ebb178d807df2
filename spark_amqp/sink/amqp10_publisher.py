"""Publishing one partition over AMQP 1.0 (``protocol=amqp1.0``): on RabbitMQ through sender links without a target
of their own, each message carrying its address in ``to``; every message unsettled until the broker's outcome.

The window of unsettled messages is ``maxInFlight``, as over AMQP 0-9-1, and a message also waits for a link's
credit. RabbitMQ gives a publishing link at most ``max_link_credit`` (170) credits, and tops them up only while
fewer than that many of the link's messages wait for their queues: one link would hold the window at 170. So when
every link is out of credit with room left in the window, the partition opens one more anonymous link in the same
session, up to ``maxInFlight`` over the broker's grant. RabbitMQ's session handles its transfers one after
another whatever their link, so a partition's messages still reach a queue in the order of its rows.
Messages go in runs, as many as the window and a link's credit take in one write: one socket write per message cost
more of the cores the broker shares than the broker's own work on the 0-9-1 path did.

The broker's outcome settles each: ``accepted`` (RabbitMQ: every target queue has it), ``rejected``
(its error names the queue and the reason), ``released`` (RabbitMQ: no queue was bound, so unroutable),
``modified``. The task fails on anything but ``accepted`` for every message (a released message only with
``mandatory``, the default: without it an unroutable message is dropped, as over AMQP 0-9-1), and on a link or
connection that ends with a permanent error. As over AMQP 0-9-1, a connection that ends with a transient one, or
settles nothing for ``confirmTimeout``, is replaced (the node it reached tried last) and its unsettled messages are
published again, for up to ``brokerOutageTimeout`` (``Reconnects``); a transient failure before the first message is
waited out as long.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from ..amqp10.performatives import Performative
from ..amqp10_client import Amqp10Client, Sender
from ..amqp10_client.links import serial_ids
from ..amqp10_client.management import bind, declare_exchange, declare_queue
from ..errors import AmqpProtocolError, AmqpPublishError, ConnectionLost, explain, is_transient
from ..transport.endpoints import Endpoint
from ..transport.outage import Outage
from .amqp10_messages import Amqp10Message, Amqp10MessageBuilder
from .confirms import ConfirmWindow
from .options import SinkOptions
from .publisher import YIELD_EVERY, LetDown, PublishResult, Reconnects, patiently, retry_hint

log = logging.getLogger("spark_amqp.sink")


class Amqp10PartitionPublisher:
    def __init__(self, options: SinkOptions, builder: Amqp10MessageBuilder, retried_since: float | None = None) -> None:
        self.options = options
        self.retried_since = retried_since  # in Spark's retry of the task: when its write began (Outage)
        self.builder = builder
        self._unsettled: dict[int, Amqp10Message] = {}  # delivery id -> message, on the current connection
        self.taken = 0  # messages taken from the partition so far
        self._rejections: list[str] = []
        self._released: list[str] = []
        self._dropped = 0

    async def publish(self, batches: Iterable[Any], description: str) -> PublishResult:
        """Publish the messages of every Arrow batch in ``batches``; a connection that lets the task down (``LetDown``)
        is replaced, and what it had not settled is published again on the next."""
        opts = self.options
        reconnects = Reconnects(opts, self.retried_since)
        lists: Iterator[list[Amqp10Message]] = self._taken_from(batches)
        left: Endpoint | None = None
        while True:

            async def ready(last: Endpoint | None = left) -> tuple[Amqp10Client, Sender]:
                return await self._ready(description, last, reconnects.outage)

            client, anonymous = await patiently(opts, ready, self.retried_since, reconnects.outage, self.taken)
            window: ConfirmWindow[Amqp10Message] = ConfirmWindow(opts.max_in_flight)
            self._unsettled = {}
            try:
                await self._send(client, anonymous, window, lists)
                return PublishResult(self.taken, self.taken)
            except LetDown as down:
                again = list(self._unsettled.values())  # in the order they were sent
                lists = itertools.chain([again + (down.unsent or [])], lists)
                delay = reconnects.after(down, bool(window.acked), len(again), client.last_heard)
                left = client.endpoint
            finally:
                await client.close()
            await asyncio.sleep(delay)

    def _taken_from(self, batches: Iterable[Any]) -> Iterator[list[Amqp10Message]]:
        for batch in batches:
            messages = self.builder.amqp10_messages(batch)
            self.taken += len(messages)
            yield messages

    async def _send(
        self, client: Amqp10Client, anonymous: Sender, window: ConfirmWindow[Amqp10Message], lists: Iterator[list[Amqp10Message]]
    ) -> None:
        opts = self.options
        anonymous.on_outcome = lambda first, last, code, values: self._outcome(window, first, last, code, values)
        failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        _watch(client.closed, failed)
        _watch(anonymous.closed, failed)
        senders: dict[str, Sender] = {}
        anonymous_links = [anonymous]
        sender: Sender | None = anonymous
        rabbitmq = client.rabbitmq
        last: Amqp10Message | None = None
        try:
            for messages in lists:
                i, n = 0, len(messages)
                try:
                    while i < n:  # in runs: as many as the window and a link's credit take, in one write
                        message = messages[i]
                        if window.outstanding >= window.limit and not await window.wait_for_room(opts.confirm_timeout, failed):
                            raise self._timeout(window, message)
                        if rabbitmq:
                            if sender is None or sender.credit <= 0:
                                sender = await self._anonymous(client, anonymous_links, window, failed)
                        else:
                            sender = senders.get(message.address)
                            if sender is None:
                                sender = senders[message.address] = await self._sender(client, window, message, failed)
                            sender = await _credit([sender], opts.confirm_timeout, failed)
                        if sender is None:
                            raise self._timeout(window, message)
                        self._raise_if_failed(failed, window, message)
                        end = i + min(n - i, window.limit - window.outstanding, sender.credit, YIELD_EVERY)
                        if not rabbitmq:  # a link per address: the run ends where the address changes
                            end = next((j for j in range(i + 1, end) if messages[j].address != message.address), end)
                        run = messages[i:end]
                        first = sender.send_run([m.record for m in run])
                        ids = serial_ids(first, (first + len(run) - 1) & 0xFFFFFFFF)
                        self._unsettled.update(zip(ids, run, strict=True))
                        window.sent(len(run))
                        last, i = run[-1], end
                        await asyncio.sleep(0)  # the reader takes outcomes and credit between runs
                        self._raise_if_broken(window, last)
                except LetDown as down:
                    down.unsent = messages[i:]
                    raise
            if window.outstanding and not await window.wait_until_all_answered(opts.confirm_timeout, failed):
                raise self._timeout(window, last)
            self._raise_if_failed(failed, window, last)
            if last is not None:
                self._raise_if_broken(window, last)
            if self._dropped:
                log.warning("AMQP sink: %d unroutable messages dropped (mandatory=false)", self._dropped)
            log.debug("AMQP sink: %d messages over %d links", window.published, len(anonymous_links) if rabbitmq else len(senders))
        finally:
            failed.cancel()

    async def _anonymous(
        self, client: Amqp10Client, links: list[Sender], window: ConfirmWindow[Amqp10Message], failed: asyncio.Future[BaseException]
    ) -> Sender | None:
        """An anonymous link with credit, opening another while the broker's grant per link is below the window."""
        sender = next((link for link in links if link.credit > 0), None)
        if sender is not None:
            return sender
        granted = links[0].granted
        if not failed.done() and granted and len(links) < -(-self.options.max_in_flight // granted):
            try:
                link = await client.sender(None, lambda first, last, code, values: self._outcome(window, first, last, code, values))
            except AmqpProtocolError as err:  # the connection ended (or the broker refused the link): as a lost link
                raise self._ended(failed.result() if failed.done() else err, window, None) from err
            _watch(link.closed, failed)
            links.append(link)
        return await _credit(links, self.options.confirm_timeout, failed)

    async def _sender(
        self, client: Amqp10Client, window: ConfirmWindow[Amqp10Message], message: Amqp10Message, failed: asyncio.Future[BaseException]
    ) -> Sender:
        """A link to ``message``'s address, where the broker needs one per address to know what it is (Artemis: a
        queue, or a topic; an address it makes on an anonymous link's first message would be a topic, which drops
        what no subscription holds)."""
        capability = "queue" if message.to_queue else "topic"
        try:
            sender = await client.sender(
                message.address, lambda first, last, code, values: self._outcome(window, first, last, code, values), capability
            )
        except AmqpProtocolError as err:
            c = self.options.connection
            raise AmqpPublishError(
                f"{explain(err, c.display_uri, c.username, c.vhost, f'address {message.address!r}')}; {window.published} messages "
                f"published before; {retry_hint(err)}"
            ) from err
        _watch(sender.closed, failed)
        return sender

    async def _ready(self, description: str, last: Endpoint | None, outage: Outage) -> tuple[Amqp10Client, Sender]:
        c = outage.attempt_options(self.options.connection)
        client = None
        try:
            client = await Amqp10Client.connect(c, f"spark-amqp sink {description}", last)
            self.builder.met_amqp10_broker(client.server_version, client.rabbitmq, client.max_frame)
            await self._declare(client)
            return client, await client.sender(None, lambda *args: None)
        except BaseException as err:
            if client is not None:
                await client.close()
            if isinstance(err, AmqpProtocolError):
                raise AmqpPublishError(f"{explain(err, c.display_uri, c.username, c.vhost)}; {retry_hint(err)}") from err
            raise

    async def _declare(self, client: Amqp10Client) -> None:
        """Options declareExchange and declareQueue, through RabbitMQ's management node (elsewhere: a clear error)."""
        opts = self.options
        if not (opts.declare_exchange or opts.declare_queue):
            return
        if not client.rabbitmq:
            product = client.server_properties.get("product", "this broker")
            raise AmqpPublishError(
                f"options 'declareExchange' and 'declareQueue' over AMQP 1.0 need RabbitMQ's management node, which {product} "
                "does not have: declare them with the broker's tools; nothing was published"
            )
        if opts.declare_exchange:
            await declare_exchange(client, opts.exchange, opts.declare_exchange, opts.exchange_durable)
        if opts.declare_queue:
            await declare_queue(client, opts.declare_queue, True, opts.queue_arguments)
            if opts.exchange:
                await bind(client, opts.exchange, opts.declare_queue, opts.binding_key)

    def _outcome(self, window: ConfirmWindow[Amqp10Message], first: int, last: int, code: int, values: list[Any]) -> None:
        """Deliveries ``first`` to ``last`` of one link settled with one outcome."""
        settled = [self._unsettled.pop(delivery_id, None) for delivery_id in serial_ids(first, last)]
        addresses = [m.address if m is not None else "?" for m in settled]
        # Outcomes may come out of order: the window only counts them.
        upto = window.answered + len(addresses)
        if code == Performative.ACCEPTED:
            window.on_confirm(upto, True, True)
            return
        if code == Performative.RELEASED:
            if self.options.mandatory:
                for address in addresses:
                    self._released.append(address)
                    window.on_return(312, "NO_ROUTE", address, "")
            else:
                self._dropped += len(addresses)
            window.on_confirm(upto, True, True)
        else:
            self._rejections.extend(f"{address}: {_reason(code, values)}" for address in addresses)
            window.on_confirm(upto, True, False)

    def _raise_if_broken(self, window: ConfirmWindow[Amqp10Message], message: Amqp10Message) -> None:
        if window.nacked or window.returned:
            parts = []
            if window.nacked:
                parts.append(f"{window.nacked} refused by the broker (first: {self._rejections[0]})")
            if window.returned:
                parts.append(
                    f"{len(window.returned)} released as unroutable (no queue is bound for them; first: '{self._released[0]}'; "
                    "mandatory=true)"
                )
            raise AmqpPublishError(
                f"{' and '.join(parts)} of {window.published} messages published over AMQP 1.0 ({window.acked} accepted so far); "
                "the task fails so that Spark retries it"
            )

    def _raise_if_failed(
        self, failed: asyncio.Future[BaseException], window: ConfirmWindow[Amqp10Message], message: Amqp10Message | None
    ) -> None:
        if failed.done() and not failed.cancelled():
            reason = failed.result()
            raise self._ended(reason, window, message) from reason

    def _ended(self, reason: BaseException, window: ConfirmWindow[Amqp10Message], message: Amqp10Message | None) -> Exception:
        to = f"'{message.address}'" if message is not None else "the broker"
        what = (
            f"{window.published - window.acked} of {window.published} messages published to {to} over AMQP 1.0 are not "
            f"accepted: the broker ended the link or the connection ({reason})"
        )
        if is_transient(reason):
            return LetDown(AmqpPublishError(what))
        return AmqpPublishError(f"{what}; {retry_hint(reason)}")

    def _timeout(self, window: ConfirmWindow[Amqp10Message], message: Amqp10Message | None) -> LetDown:
        to = f"'{message.address}'" if message is not None else "the broker"
        return LetDown(
            AmqpPublishError(
                f"{window.outstanding} of {window.published} messages published to {to} over AMQP 1.0 got no outcome (or no "
                f"credit to send more) within confirmTimeout={self.options.confirm_timeout:g}s"
            )
        )


async def _credit(links: list[Sender], timeout: float, failed: asyncio.Future[BaseException]) -> Sender | None:
    """The first of ``links`` with credit, once one has it (or ``failed`` fired: any link, and the caller sees why);
    None after ``timeout`` without credit."""
    while not failed.done():
        sender = next((link for link in links if link.credit > 0), None)
        if sender is not None:
            return sender
        for link in links:
            link.credit_changed.clear()
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(link.credit_changed.wait()) for link in links]
        done, _ = await asyncio.wait([*waiters, failed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if not done:
            return None
    return links[0]


def _watch(ended: asyncio.Future[Any], failed: asyncio.Future[BaseException]) -> None:
    """``failed`` gets why ``ended`` (a link's or the connection's end) happened, if it happens first."""

    def done(future: asyncio.Future[Any]) -> None:
        if not failed.done() and not future.cancelled():
            failed.set_result(future.result() or ConnectionLost("the broker ended the link"))

    ended.add_done_callback(done)


def _reason(code: int, values: list[Any]) -> str:
    """An outcome other than accepted, in words: a rejection's error condition and description."""
    if code == Performative.REJECTED:
        error = values[0] if values else None
        fields = getattr(error, "value", None) or []
        condition = fields[0] if fields else "rejected"
        description = fields[1] if len(fields) > 1 and fields[1] else ""
        return f"rejected ({condition}{': ' + str(description) if description else ''})"
    if code == Performative.MODIFIED:
        return "modified (the broker could not take it now)"
    return f"an outcome with descriptor {code:#x}"
