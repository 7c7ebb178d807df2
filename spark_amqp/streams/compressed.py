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
over TLS), with the same login and TLS. Where that cannot be reached, nothing tells a compressed sub-entry from
offsets that hold no message (the tracking chunk RabbitMQ opens each segment with), and reading on would skip the
first without a word: an availableNow run once ended "successfully" with 0 of 2,000 rows so. So ``Unchecked`` is
raised, which the caller waits out as an outage (the port may come back) and which then fails the read, naming the
stream, the offsets and the port, within ``brokerOutageTimeout``. With ``failOnDataLoss=false`` the read goes on
past them instead, with a warning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref

from ..client import AmqpClient
from ..errors import AmqpProtocolError, AmqpSourceError, ConnectionLost, Unchecked
from ..stream_protocol import chunks
from ..stream_protocol.client import OffsetSpec, StreamClient
from ..stream_protocol.compression import CODECS
from ..stream_protocol.topology import connect_to_member
from ..transport.endpoints import Endpoint
from ..transport.options import ConnectionOptions
from .protocol_probe import chunk_data, free_subscription, has_stats

__all__ = ["CompressedCheck", "CompressedSubEntry", "UncheckedRefused", "stream_protocol_options", "undelivered"]

log = logging.getLogger("spark_amqp.streams")

# The most a check waits for its connection and its chunk: it answers a question, it does not wait out an outage.
_PATIENCE = 5.0
# Chunks in flight while a question reads on to the offset it asks about.
_CREDIT = 10
STREAM_PORT, STREAM_TLS_PORT = 5552, 5551


class CompressedSubEntry(AmqpSourceError):
    """A range read over AMQP 0-9-1 holds records of a compressed sub-entry, which RabbitMQ does not deliver there."""


class UncheckedRefused(AmqpSourceError):
    """``Unchecked``, but the stream protocol's port refused the question for good (another broker there, a login it
    refuses): not waited out."""


def stream_protocol_options(options: ConnectionOptions) -> ConnectionOptions:
    """The same hosts, login and TLS, on the stream protocol's port."""
    port = options.stream_port or (STREAM_TLS_PORT if options.tls is not None else STREAM_PORT)
    endpoints = tuple(dict.fromkeys(Endpoint(e.host, port) for e in options.endpoints))
    return dataclasses.replace(
        options, endpoints=endpoints, stream_protocol=True, connection_timeout=min(options.connection_timeout, _PATIENCE)
    )


class CompressedCheck:
    """Questions about what an AMQP reader did not get; the stream-protocol connection is opened on the first, and kept
    (one per reader, or per planning connection: ``for_client``). ``fail_on_data_loss``: False reads on, with a
    warning, past offsets that cannot be checked."""

    def __init__(self, options: ConnectionOptions, fail_on_data_loss: bool = True) -> None:
        self.options = stream_protocol_options(options)
        self.fail_on_data_loss = fail_on_data_loss
        self.protocol = "AMQP 1.0" if options.amqp10 else "AMQP 0-9-1"
        self._client: StreamClient | None = None

    @classmethod
    def for_client(cls, client: AmqpClient) -> CompressedCheck:
        """The check kept with an AMQP 0-9-1 connection (the planner's probes), closed with it."""
        check = _BY_CLIENT.get(client)
        if check is None:
            check = _BY_CLIENT[client] = cls(client.options)
            client.closed.add_done_callback(lambda _: check.abort())
        return check

    async def refuse(
        self,
        stream: str,
        spec: tuple[int, int],
        before: int | None = None,
        scan: bool = True,
        missing: str | None = None,
        within: float | None = None,
    ) -> None:
        """Raises ``CompressedSubEntry`` when the chunks from ``spec`` up to offset ``before`` (the first only without
        ``before`` or ``scan``) hold a compressed sub-entry with a record before ``before``; ``Unchecked`` when the
        stream protocol cannot be asked (``missing`` says what did not come, for its message). ``within``: the most a
        connection attempt may take (the time left before a deadline)."""
        try:
            client = await self._connected(stream, within)
            if spec == OffsetSpec.LAST and has_stats(client) and (await client.stats(stream)).get("committed_chunk_id", -1) < 0:
                return  # empty: nothing to wait for
            if before is None or not scan:
                data = await chunk_data(client, stream, spec, self.options.connection_timeout)
                if data is not None:
                    _refuse(stream, chunks.entry_spans(data, chunks.read_header(data)), before)
            else:
                await self._scan(client, stream, spec, before)
        except AmqpProtocolError as err:
            self.abort()
            self._unanswered(stream, missing or undelivered(spec, before), err)

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

    async def _connected(self, stream: str, within: float | None) -> StreamClient:
        if self._client is None or self._client.closed.done():
            options = self.options
            if within is not None and within < options.connection_timeout:
                options = dataclasses.replace(options, connection_timeout=max(0.1, within))
            self._client = await connect_to_member(options, stream, "spark-amqp sub-entry check")
        return self._client

    def _unanswered(self, stream: str, missing: str, err: AmqpProtocolError) -> None:
        ports = ", ".join(str(e) for e in self.options.endpoints)
        said = (
            f"stream '{stream}': {missing} did not come over {self.protocol}, and whether they are compressed sub-entries "
            f"(which RabbitMQ does not deliver over AMQP 0-9-1 and 1.0) or offsets that hold no message (the tracking chunk "
            f"RabbitMQ opens each segment with) could not be asked over the stream protocol at {ports}: {err}"
        )
        if not self.fail_on_data_loss:
            log.warning("AMQP source: %s; reading on past them (failOnDataLoss=false)", said)
            return
        if not err.transient:
            # A refusal there (a login, a port that speaks another protocol, a stream it does not know) is not waited out.
            raise UncheckedRefused(said + _FIX)
        raise Unchecked(said + _FIX) from err


# What the user can change, after every message of ``Unchecked``.
_FIX = (
    ". Set option 'streamPort' to the port of the broker's stream protocol (plugin rabbitmq_stream; 5552, or 5551 "
    "with TLS), or read the stream with a rabbitmq-stream:// uri; with failOnDataLoss=false the read goes on past "
    "offsets it cannot check, skipping them if they are compressed"
)


def undelivered(spec: tuple[int, int], before: int | None) -> str:
    """What a read or probe from ``spec`` (up to ``before``) did not get, in words."""
    kind, value = spec
    if spec == OffsetSpec.LAST:
        return "the messages of its last chunk"
    if spec == OffsetSpec.FIRST:
        return "its messages from its first offset on"
    if kind == OffsetSpec.timestamp(0)[0]:
        return f"its messages from the chunk written at or after {value} ms (epoch) on"
    if before is None:
        return f"its messages from offset {value} on"
    return f"offset {value}" if before == value + 1 else f"offsets {value} to {before - 1}"


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
