"""``ConsumerSession``: the source runner's connection over AMQP 0-9-1 (an ``IoSession``).

One channel per queue, manual acks, a per-consumer prefetch. The runner thread
acknowledges through ``ack`` (scheduled onto the I/O loop). A channel that dies is
reopened with backoff under a new session id, so a delivery tag is only ever
acknowledged on the channel that delivered it.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from pamqp import commands

from .. import framing
from ..client import AmqpClient, ClientChannel, LazyProperties, queue_stats, stats_of
from ..errors import AmqpProtocolError, AmqpReplyError, AmqpSourceError, NotFound, OtherConsumers, StreamInQueueMode
from ..reading.stream_consumers import is_stream
from ..transport.backoff import Backoff
from .channel_policy import ChannelPolicy
from .inbox import AckConfirmed, Delivery, SessionClosed
from .io_session import IoSession
from .options import SourceOptions

log = logging.getLogger("spark_amqp.queues")


class _Consumer:
    """One queue's channel and subscription."""

    def __init__(self, channel: ClientChannel, session: str, queue: str) -> None:
        self.channel = channel
        self.session = session
        self.queue = queue
        self.tag = ""
        # Set when the broker's basic.cancel is read. RabbitMQ 4.3 ignores an ack of a delivery its consumer
        # timeout already gave back, so a proof read after the cancel proves nothing.
        self.cancelled = False


class ConsumerSession(IoSession):
    client_class = AmqpClient

    def __init__(self, options: SourceOptions, run_id: str) -> None:
        super().__init__(options, run_id)
        self._consumers: dict[str, _Consumer] = {}  # session id -> consumer
        self._policy = ChannelPolicy(options)

    # -- runner-thread API ------------------------------------------------

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

    def settle(self, queues: list[str], timeout: float) -> bool:
        """Whether every delivery the broker sent ``queues``' consumers before this call is now in the inbox: a
        synchronous basic.qos on each of their channels, whose reply the channel writes behind them. False where a
        queue has no live channel, or one closed meanwhile."""
        return self._call(lambda: self._settle(queues), timeout)

    # -- I/O thread -------------------------------------------------------------

    def _lost_all(self, reason: str) -> None:
        for consumer in list(self._consumers.values()):
            self._session_lost(consumer, reason)

    async def _serve(self, client: AmqpClient, queue: str) -> None:
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
            consumer.cancelled = True
            self._background(self._cancelled(consumer))

        channel.on_delivery = on_first_delivery
        channel.on_cancel = on_cancel
        await self._basic_consume(consumer)
        self._subscribed(queue)

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
        error = AmqpSourceError(message)
        error.__cause__ = reason
        self._fail(error)
        return True

    def _session_lost(self, consumer: _Consumer, reason: str) -> None:
        if self._consumers.pop(consumer.session, None) is not None:
            self._consuming.discard(consumer.queue)
            self.inbox.append(SessionClosed(consumer.session, consumer.queue, reason))

    def _ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
        consumer = self._consumers.get(session)
        if consumer is None or consumer.cancelled or not consumer.channel.is_open:
            return
        if multiple is not None:
            consumer.channel.ack(multiple, True)
        for tag in singles:
            consumer.channel.ack(tag, False)
        self._background(self._prove_ack(consumer, ack_round))

    async def _prove_ack(self, consumer: _Consumer, ack_round: int) -> None:
        # basic.qos is synchronous: its reply proves the ack before it was processed.
        try:
            await consumer.channel.rpc(commands.Basic.Qos(prefetch_count=self.options.prefetch))
        except AmqpProtocolError:
            return  # the channel is gone: its deliveries come back, and the ledger knows the ack is unproven
        if consumer.cancelled:
            return  # the cancel came first: the broker may have given the acked deliveries back before the ack
        self.inbox.append(AckConfirmed(consumer.session, ack_round))

    async def _settle(self, queues: list[str]) -> bool:
        live = [c for c in self._consumers.values() if c.queue in queues and not c.cancelled and not c.channel.closed.done()]
        if {c.queue for c in live} != set(queues):
            return False
        try:
            await asyncio.gather(*(c.channel.rpc(commands.Basic.Qos(prefetch_count=self.options.prefetch)) for c in live))
        except AmqpProtocolError:
            return False
        return True

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

    async def _stop(self) -> None:
        client = self._client
        if client is not None:
            # Unacked deliveries go back as nacks (a closed channel would count as a return
            # towards a quorum queue's delivery-limit on RabbitMQ 4.3), then one
            # connection.close: quick, and Spark does not wait long.
            await asyncio.gather(*(c.channel.give_back(c.tag) for c in self._consumers.values() if c.tag), return_exceptions=True)
            await client.close()
        if self._main is not None:
            self._main.cancel()
