"""Compressed sub-entries met over AMQP 0-9-1: the broker holds them, and never delivers them there.

Stream clients (Java, Go, .NET, this sink) may batch messages into sub-entries compressed with gzip, snappy,
lz4 or zstd. Measured: RabbitMQ 4.0.5 and 4.3.6 skip a compressed sub-entry's records for an AMQP 0-9-1
consumer, with no error (their offsets are simply missing from its deliveries); 3.10.8 closes the connection
(541) at the chunk that holds one; an uncompressed sub-entry is delivered. Silence alone proves nothing:
offsets have gaps no reader sees (tracking chunks), and a broker may be slow. So where an AMQP 0-9-1 read
misses offsets the stream holds (a gap inside the stream, a range whose last offsets do not come, a probe
that gets nothing from a stream that counts messages), ``CompressedCheck`` asks over the stream protocol what
is there, and a compressed sub-entry fails the read at once, naming the stream, the offset and the codec, and
saying to read over the stream protocol, which decompresses every codec.

The question goes to the uri's hosts on the stream protocol's port (option ``streamPort``; by default 5552, 5551
over TLS), with the same login and TLS. Where that cannot be reached, it is asked no more: a stream written
by stream clients is reachable there, and a warning says the read could not be checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref

from ..client import AmqpClient
from ..errors import AmqpProtocolError, AmqpSourceError, ConnectionLost
from ..stream_protocol import chunks
from ..stream_protocol.client import OffsetSpec, StreamClient
from ..stream_protocol.compression import CODECS
from ..stream_protocol.topology import connect_to_member
from ..transport.endpoints import Endpoint
from ..transport.options import ConnectionOptions
from .protocol_probe import chunk_data, free_subscription, has_stats

__all__ = ["CompressedCheck", "CompressedSubEntry", "stream_protocol_options"]

log = logging.getLogger("spark_amqp.streams")

# The most a check waits for its connection and its chunk: it answers a question, it does not wait out an outage.
_PATIENCE = 5.0
# Chunks in flight while a question reads on to the offset it asks about.
_CREDIT = 10
STREAM_PORT, STREAM_TLS_PORT = 5552, 5551


class CompressedSubEntry(AmqpSourceError):
    """A range read over AMQP 0-9-1 holds records of a compressed sub-entry, which RabbitMQ does not deliver there."""


def stream_protocol_options(options: ConnectionOptions) -> ConnectionOptions:
    """The same hosts, login and TLS, on the stream protocol's port."""
    port = options.stream_port or (STREAM_TLS_PORT if options.tls is not None else STREAM_PORT)
    endpoints = tuple(dict.fromkeys(Endpoint(e.host, port) for e in options.endpoints))
    return dataclasses.replace(
        options, endpoints=endpoints, stream_protocol=True, connection_timeout=min(options.connection_timeout, _PATIENCE)
    )


class CompressedCheck:
    """Questions about what an AMQP 0-9-1 reader did not get; the stream-protocol connection is opened on the first,
    and kept (one per reader, or per planning connection: ``for_client``)."""

    def __init__(self, options: ConnectionOptions) -> None:
        self.options = stream_protocol_options(options)
        self.unreachable: str | None = None  # why the stream protocol could not be asked
        self._client: StreamClient | None = None

    @classmethod
    def for_client(cls, client: AmqpClient) -> CompressedCheck:
        """The check kept with an AMQP 0-9-1 connection (the planner's probes), closed with it."""
        check = _BY_CLIENT.get(client)
        if check is None:
            check = _BY_CLIENT[client] = cls(client.options)
            client.closed.add_done_callback(lambda _: check.abort())
        return check

    async def refuse(self, stream: str, spec: tuple[int, int], before: int | None = None, scan: bool = True) -> None:
        """Raises ``CompressedSubEntry`` when the chunks from ``spec`` up to offset ``before`` (the first only without
        ``before`` or ``scan``) hold a compressed sub-entry with a record before ``before``."""
        client = await self._connected(stream)
        if client is None:
            return
        try:
            if spec == OffsetSpec.LAST and has_stats(client) and (await client.stats(stream)).get("committed_chunk_id", -1) < 0:
                return  # empty: nothing to wait for
            if before is None or not scan:
                data = await chunk_data(client, stream, spec, self.options.connection_timeout)
                if data is not None:
                    _refuse(stream, chunks.entry_spans(data, chunks.read_header(data)), before)
            else:
                await self._scan(client, stream, spec, before)
        except AmqpProtocolError as err:
            self._give_up(stream, err)

    async def _scan(self, client: StreamClient, stream: str, spec: tuple[int, int], before: int) -> None:
        """The chunks from ``spec`` up to ``before``, their entries' heads only (RabbitMQ 3.10 refuses a whole read at a
        compressed chunk its read-ahead reached, which may be many chunks on)."""
        arrived: asyncio.Queue[bytes] = asyncio.Queue()
        sub = free_subscription(client)
        await client.subscribe(sub, stream, spec, _CREDIT, lambda data: arrived.put_nowait(bytes(data)))
        try:
            while True:
                data = await asyncio.wait_for(arrived.get(), self.options.connection_timeout)
                header = chunks.read_header(data)
                _refuse(stream, chunks.entry_spans(data, header), before)
                if header.next_offset >= before:
                    return
                client.credit(sub, 1)
        except TimeoutError:
            return  # the stream ends before ``before`` now: nothing more to tell
        finally:
            if not client.closed.done():
                await client.unsubscribe(sub)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def abort(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.abort(ConnectionLost("closed"))

    async def _connected(self, stream: str) -> StreamClient | None:
        if self.unreachable is not None:
            return None
        if self._client is None or self._client.closed.done():
            try:
                self._client = await connect_to_member(self.options, stream, "spark-amqp sub-entry check")
            except AmqpProtocolError as err:
                self._give_up(stream, err)
                return None
        return self._client

    def _give_up(self, stream: str, err: AmqpProtocolError) -> None:
        self.unreachable = str(err)
        log.warning(
            "AMQP source: stream '%s': cannot ask %s whether offsets RabbitMQ did not deliver over AMQP 0-9-1 are compressed "
            "sub-entries (%s); reading on as if none were",
            stream,
            self.options.display_uri,
            err,
        )


def _refuse(stream: str, spans: list[tuple[int, int, int | None]], before: int | None) -> None:
    for first, count, codec in spans:
        if codec and (before is None or first < before):
            raise CompressedSubEntry(
                f"stream '{stream}': offsets {first} to {first + count - 1} are a sub-entry compressed with "
                f"{CODECS.get(codec, codec)} (a stream client's sub-entry batching), which RabbitMQ does not deliver "
                "over AMQP 0-9-1 (4.x skips it, 3.10 closes the connection): read this stream over the stream protocol, "
                "with a rabbitmq-stream:// uri (port 5552, or 5551 with TLS), which reads every codec"
            )


_BY_CLIENT: weakref.WeakKeyDictionary[AmqpClient, CompressedCheck] = weakref.WeakKeyDictionary()
