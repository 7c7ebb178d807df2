"""Publishing one partition over RabbitMQ's stream protocol, with confirms and publisher deduplication.

Each message is kept until the broker confirms it (at most ``maxInFlight`` messages and
``MAX_IN_FLIGHT_BYTES`` at a time). A failure the broker may get over — the connection dropped,
the stream's leader moved (a metadata update, "stream not available" while a new leader is
elected) — is met by connecting again: before anything is published, always; after, with
deduplication on, publishing every unconfirmed message again under the same producer name and
ids: the broker stores those it had not stored and confirms the others without storing them
again. Nothing is lost that way because one connection sends a stream its ids in increasing
order, so the broker never holds an id above one it did not store. This goes on, with backoff,
until ``brokerOutageTimeout`` has passed without a confirm (a failover takes seconds; the task
must not fail at once, or Spark's few quick retries fail the query with it); then, and for any
other failure, the task fails with an ``AmqpPublishError`` naming the stream, the response code
and the counts. Without deduplication nothing published is published again here: the task fails
and Spark retries it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from ..errors import AmqpProtocolError, AmqpPublishError, StreamResponseError, explain, is_transient
from ..stream_protocol.client import StreamClient
from ..stream_protocol.super_streams import partitions_by_name
from ..stream_protocol.topology import connect_to_leader, connect_to_leaders
from ..transport.backoff import Backoff
from ..transport.outage import Outage
from .options import SinkOptions
from .producers import Producer
from .publisher import PublishResult, retry_hint
from .stream_messages import MESSAGE_OVERHEAD, StreamMessage, StreamMessageBuilder
from .sub_entries import SubEntries, uncompressed_limit

__all__ = ["MAX_IN_FLIGHT_BYTES", "StreamPartitionPublisher"]

log = logging.getLogger("spark_amqp.sink")

MAX_IN_FLIGHT_BYTES = 64 << 20  # unconfirmed messages are kept to publish again: bound their memory too
MAX_PUBLISHERS = 256  # a publisher id is one byte: one per partition stream on the task's connection
_FRAME_HEAD = 13  # size, key, version, publisher id, count


class _Failed(Exception):
    """Something ended the connection's usefulness: ``reason`` says what; ``stream`` which stream, if one;
    ``unreachable``: while connecting (no node served the stream), not a connection that ended mid-publish."""

    def __init__(self, reason: AmqpProtocolError, stream: str | None = None, unreachable: bool = False) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.stream = stream
        self.unreachable = unreachable


class StreamPartitionPublisher:
    def __init__(self, options: SinkOptions, producer: Producer, retried_since: float | None = None) -> None:
        self.options = options
        self.retried_since = retried_since  # in Spark's retry of the task: when its write began (Outage)
        self.producer = producer
        self.builder = StreamMessageBuilder(options, producer)
        self.pending: list[dict[int, StreamMessage]] = []  # per target: unconfirmed, by publishing id
        self.published = 0
        self.confirmed = 0
        self.in_flight_bytes = 0
        self._progress = asyncio.Event()
        self._failure: _Failed | None = None
        self._client: StreamClient | None = None  # the first connection: what the messages depend on is learned there
        self._via: list[StreamClient] = []  # per target, the connection it is published on
        self._buffers: dict[int, list[StreamMessage]] = {}
        self._buffer_sizes: dict[int, int] = {}  # the bytes of each buffer's frame so far
        self._buffered = 0
        self._learned = False
        self.sub_entries: SubEntries | None = None  # with option subEntrySize: messages grouped per stream

    async def publish(self, batches: Iterable[pa.RecordBatch]) -> PublishResult:
        """Publish every row; return once the broker has confirmed every message."""
        messages: Iterator[StreamMessage] = (m for batch in batches for m in self.builder.stream_messages(batch))
        backoff = Backoff()
        outage = Outage(self.options.connection.outage_timeout, self.options.connection.display_uri, self.retried_since)
        while True:
            confirmed_before = self.confirmed
            began = time.monotonic()
            try:
                await self._connect(outage)
                await self._resend()
                for message in messages:
                    await self._take(message)
                while self.sub_entries is not None and (rest := self.sub_entries.next_open()) is not None:
                    await self._send(rest)
                await self._flush()
                await self._wait(lambda: not self.published - self.confirmed)
                return PublishResult(self.published, self.confirmed)
            except _Failed as failed:
                if self.confirmed > confirmed_before:
                    backoff.reset()
                    outage.recovered()
                outage.failed(failed.reason, unreachable=failed.unreachable, heard=self._heard(), tried=began)
                delay = backoff.next()
                if not self._may_retry(failed, outage, delay):
                    raise self._error(failed, outage, delay) from failed.reason
                log.warning(
                    "stream sink %s: %s; connecting again in %.1fs to publish the %d unconfirmed message(s) (attempt %d; "
                    "the broker drops those it already stored; no confirm for %.0fs of brokerOutageTimeout=%gs)",
                    self.producer.description,
                    failed.reason,
                    delay,
                    self.published - self.confirmed,
                    backoff.failures,
                    outage.seconds(),
                    outage.timeout,
                )
                await asyncio.sleep(delay)
            finally:
                await self._close()

    # -- the connection --------------------------------------------------------------------

    def _heard(self) -> float | None:
        """When the connections that let the publisher down last heard from their brokers (None: none was open)."""
        heard = [c.last_heard for c in (self._client, *self._via) if c is not None]
        return max(heard) if heard else None

    async def _connect(self, outage: Outage) -> None:
        opts = self.options
        options = outage.attempt_options(opts.connection)
        self._failure = None
        self._buffers.clear()
        self._buffer_sizes.clear()
        self._buffered = 0
        name = f"spark-amqp sink {self.producer.description}"
        try:
            if opts.stream is not None:  # one stream: publish on its leader's node (much faster than forwarded)
                client = await connect_to_leader(options, opts.stream, name)
            else:  # a super stream's partitions lead on several nodes: a connection to each leader, found below
                client = await StreamClient.connect(options, name)
        except AmqpProtocolError as err:
            raise _Failed(err, unreachable=True) from None
        self._client = client
        self._via = [client]
        if not self._learned:  # what the messages depend on: the broker's line and frame size, the partitions
            self.builder.met_stream_broker(client.server_version, client.frame_max)
            if opts.sub_entry_size > 1:
                self.sub_entries = SubEntries(opts.sub_entry_size, opts.compression, client.frame_max)
                self.builder.max_record = min(self.builder.max_record, uncompressed_limit(client.frame_max) - 4)
            if opts.super_stream is not None:
                self.builder.route_to(await self._partitions(client, opts.super_stream))
            self.pending = [{} for _ in self.builder.targets]
            self._learned = True
        if opts.super_stream is not None:
            try:
                self._via = await connect_to_leaders(client, self.builder.targets)
            except AmqpProtocolError as err:
                raise _Failed(err, opts.super_stream, unreachable=True) from None
            if client not in self._via:  # it leads none of the partitions
                self._client = self._via[0]
                await client.close()
        for connection in self._connections():
            connection.on_metadata_update = self._on_metadata_update
        for target, stream in enumerate(self.builder.targets):
            try:
                await self._via[target].declare_publisher(
                    target,
                    self.producer.name or "",
                    stream,
                    lambda ids, t=target: self._on_confirm(t, ids),  # type: ignore[misc]
                    lambda errors, s=stream: self._on_error(s, errors),  # type: ignore[misc]
                )
            except AmqpProtocolError as err:
                raise _Failed(err, stream, unreachable=True) from None

    def _connections(self) -> list[StreamClient]:
        """Every connection this partition publishes on (one per leader node), each once."""
        return list(dict.fromkeys(self._via))

    async def _partitions(self, client: StreamClient, super_stream: str) -> tuple[str, ...]:
        """``<name>-0``, ``<name>-1``, … up to the first that does not exist: as the AMQP sink finds them."""
        try:
            found = await partitions_by_name(client, super_stream)
        except AmqpProtocolError as err:
            raise _Failed(err, super_stream, unreachable=True) from None
        return self._checked_partitions(super_stream, found)

    def _checked_partitions(self, super_stream: str, found: list[str]) -> tuple[str, ...]:
        if not found:
            raise AmqpPublishError(
                f"super stream '{super_stream}' on {self.options.connection.display_uri}: no partition stream "
                f"'{super_stream}-0' found. Declare the super stream (rabbitmq-streams add_super_stream); nothing was published"
            )
        if len(found) > MAX_PUBLISHERS:
            raise AmqpPublishError(
                f"super stream '{super_stream}' has {len(found)} partitions; the stream sink publishes to at most "
                f"{MAX_PUBLISHERS} from one task (a stream protocol connection has {MAX_PUBLISHERS} publisher ids)"
            )
        return tuple(found)

    async def _close(self) -> None:
        clients = self._connections()  # the first connection is among them, or closed once it leads no partition
        self._client, self._via = None, []
        for client in clients:
            await client.close()

    # -- sending ------------------------------------------------------------------------------

    async def _resend(self) -> None:
        """After a reconnect: every unconfirmed message again, in id order per stream."""
        for pending in self.pending:
            for message in list(pending.values()):
                self._buffer(message)
        await self._flush()

    async def _take(self, message: StreamMessage) -> None:
        """A message of the partition: out now, or into its stream's open sub-entry."""
        if self.sub_entries is None:
            await self._send(message)
        elif (complete := self.sub_entries.add(message)) is not None:
            await self._send(complete)

    async def _send(self, message: StreamMessage) -> None:
        # Pending first: whatever fails from here on, a reconnect publishes it again.
        self.pending[message.target][message.publishing_id] = message
        self.published += message.messages
        self.in_flight_bytes += len(message.record)
        limit = self.options.max_in_flight
        if self.published - self.confirmed > limit or self.in_flight_bytes > MAX_IN_FLIGHT_BYTES:
            await self._flush()
            await self._wait(lambda: self.published - self.confirmed <= limit and self.in_flight_bytes <= MAX_IN_FLIGHT_BYTES)
        if self._failure is not None:
            raise self._failure
        self._buffer(message)
        if self._buffered >= 256:  # let the reader take confirms while a long partition goes out
            await self._flush()

    def _buffer(self, message: StreamMessage) -> None:
        """Into its stream's next frame; a full frame goes out first."""
        target = message.target
        size = 8 + len(message.record) if message.sub_entry else len(message.record) + MESSAGE_OVERHEAD - _FRAME_HEAD
        if message.filter_value is not None:
            size += len(message.filter_value.encode("utf-8"))
        buffer = self._buffers.setdefault(target, [])
        if buffer and _FRAME_HEAD + self._buffer_sizes[target] + size > self._via[target].frame_max:
            self._write(target, buffer)
            buffer = self._buffers[target] = []
            self._buffer_sizes[target] = 0
        buffer.append(message)
        self._buffer_sizes[target] = self._buffer_sizes.get(target, 0) + size
        self._buffered += 1

    async def _flush(self) -> None:
        for target, buffer in self._buffers.items():
            if buffer:
                self._write(target, buffer)
        self._buffers.clear()
        self._buffer_sizes.clear()
        self._buffered = 0
        await asyncio.sleep(0)
        if self._failure is not None:
            raise self._failure

    def _write(self, target: int, messages: list[StreamMessage]) -> None:
        client = self._via[target]
        if client.closed.done():
            raise _Failed(client.closed.result())
        if messages[0].sub_entry:  # all or none are: sub-entries are a partition's choice
            client.publish_sub_entries(target, [(m.publishing_id, m.record) for m in messages])
        elif any(m.filter_value is not None for m in messages):
            client.publish_filtered(target, [(m.publishing_id, m.filter_value, m.record) for m in messages])
        else:
            client.publish(target, [(m.publishing_id, m.record) for m in messages])

    async def _wait(self, done: Callable[[], bool]) -> None:
        """Until ``done()`` holds, a failure, or ``confirmTimeout`` without a confirm."""
        clients = self._connections()
        while not done():
            if self._failure is not None:
                raise self._failure
            self._progress.clear()
            before = self.confirmed
            progress: asyncio.Future[object] = asyncio.ensure_future(self._progress.wait())
            closed: list[asyncio.Future[object]] = [c.closed for c in clients]  # type: ignore[misc]
            try:
                await asyncio.wait([progress, *closed], timeout=self.options.confirm_timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                progress.cancel()
            lost = next((c for c in clients if c.closed.done()), None)
            if lost is not None and self._failure is None:
                self._failure = _Failed(lost.closed.result())
            if self._failure is None and self.confirmed == before and not done():
                raise self._timeout()

    # -- what the broker says -------------------------------------------------------------------------------

    def _on_confirm(self, target: int, ids: list[int]) -> None:
        pending = self.pending[target]
        for publishing_id in ids:
            message = pending.pop(publishing_id, None)
            if message is not None:  # a message published again after a reconnect may be confirmed twice
                self.confirmed += message.messages
                self.in_flight_bytes -= len(message.record)
        self._progress.set()

    def _on_error(self, stream: str, errors: list[tuple[int, int]]) -> None:
        if self._failure is None and errors:
            code = errors[0][1]
            self._failure = _Failed(StreamResponseError(code, f"{len(errors)} message(s) refused by the broker"), stream)
        self._progress.set()

    def _on_metadata_update(self, code: int, stream: str) -> None:
        if stream in self.builder.targets and self._failure is None:
            self._failure = _Failed(StreamResponseError(code, "the broker announced a metadata update"), stream)
            self._progress.set()

    # -- errors ----------------------------------------------------------------------------------------------

    def _may_retry(self, failed: _Failed, outage: Outage, delay: float) -> bool:
        """Transient, safe to repeat (nothing published yet, or deduplication drops what was stored), and the
        next attempt comes within brokerOutageTimeout of the last confirm."""
        safe = self.producer.name is not None or not self.published
        return safe and is_transient(failed.reason) and outage.allows(delay)

    def _error(self, failed: _Failed, outage: Outage, delay: float) -> AmqpPublishError:
        c = self.options.connection
        subject = f"stream '{failed.stream}'" if failed.stream else self.options.target
        unconfirmed = self.published - self.confirmed
        waited = ""
        # Why a transient fault was not retried: the deadline, which a retried task's first refusal can meet when
        # the next delay would pass it (then its error must say the earlier attempt waited, not blame the broker).
        if is_transient(failed.reason) and (outage.failures > 1 or outage.retry_expired(delay)):
            waited = f" ({outage.waited()})"
        if not self.published:
            said = explain(failed.reason, c.display_uri, c.username, c.vhost, subject)
            return AmqpPublishError(f"{said}{waited}; nothing was published; {retry_hint(failed.reason)}")
        return AmqpPublishError(
            f"{unconfirmed} of {self.published} messages published to {subject} on {c.display_uri} are not confirmed "
            f"({self.confirmed} confirmed): {failed.reason}{waited}; {retry_hint(failed.reason)}"
        )

    def _timeout(self) -> AmqpPublishError:
        return AmqpPublishError(
            f"{self.published - self.confirmed} of {self.published} messages published to {self.options.target} got no "
            f"confirm within confirmTimeout={self.options.confirm_timeout:g}s; the task fails so that Spark retries it"
        )
