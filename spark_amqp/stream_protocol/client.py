"""``StreamClient``: one connection in RabbitMQ's stream protocol (port 5552), on asyncio.

A ``transport.Connection``, as ``spark_amqp.client.AmqpClient`` is for AMQP 0-9-1 (dialing, TLS,
the SASL login, heartbeats and token renewal are the transport's). The protocol object owns the
socket: ``data_received`` cuts frames, answers go to the request waiting on their
correlation id, chunks to their subscription's callback, confirms to their
publisher's. Every way the connection ends is one exception on ``closed``; a refused
request raises ``StreamResponseError`` with the broker's response code. A connection
that logged in with an OAuth 2 token renews it before it expires, with a second
``SaslAuthenticate`` (``transport/renewal.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable

from ..errors import AmqpProtocolError, ConnectionLost, HandshakeFailed, StreamResponseError, TokenError
from ..transport.connection import CLOSE_TIMEOUT, Connection, parse_version
from ..transport.login import Login
from ..transport.options import ConnectionOptions
from ..transport.tokens import Token
from .wire import OK, RESPONSE, Key, Reader, command, frame, map_, string, strings

__all__ = ["OffsetSpec", "StreamClient"]

# What the client asks for in tune; the broker's default frame_max is 1 MiB.
FRAME_MAX = 1_048_576
_SIZE = struct.Struct(">I")
_HEAD = struct.Struct(">HH")
_CORR = struct.Struct(">IH")
_ID = struct.Struct(">Q")
# What a token renewal's SaslAuthenticate is about (its refusal is the connection's end).
RENEWAL = "OAuth 2 token renewal"
# A refused login: authentication failure, and its loopback-only variant (guest from another host).
_LOGIN_REFUSED = (0x08, 0x0B)
_NO_SUBSCRIPTION = 0x04


class OffsetSpec:
    """Subscribe's offset specification: (type, value)."""

    FIRST = (1, 0)
    LAST = (2, 0)
    NEXT = (3, 0)

    @staticmethod
    def offset(value: int) -> tuple[int, int]:
        return (4, value)

    @staticmethod
    def timestamp(ms: int) -> tuple[int, int]:
        return (5, ms)


ChunkHandler = Callable[[memoryview], None]
ConfirmHandler = Callable[[list[int]], None]
ErrorHandler = Callable[[list[tuple[int, int]]], None]


class StreamClient(Connection):
    def __init__(self, loop: asyncio.AbstractEventLoop, options: ConnectionOptions, client_name: str, login: Login | None = None) -> None:
        super().__init__(loop, options, client_name, login)
        self.server_properties: dict[str, str] = {}
        self.connection_properties: dict[str, str] = {}
        self.frame_max = FRAME_MAX
        self._correlations = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Reader], str]] = {}
        self._tuned: asyncio.Future[None] = loop.create_future()
        self.subscriptions: dict[int, ChunkHandler] = {}
        self.publishers: dict[int, tuple[ConfirmHandler, ErrorHandler]] = {}
        # METADATA_UPDATE: a stream this connection reads or writes was deleted or lost its leader.
        self.on_metadata_update: Callable[[int, str], None] | None = None

    def _heartbeat_frame(self) -> bytes:
        return frame(Key.HEARTBEAT, 1)

    async def _open(self) -> None:
        """Peer properties, SASL, tune and the vhost, as requests and answers."""
        props = {"product": "spark-amqp", "connection_name": self.client_name}
        reply = await self.request(Key.PEER_PROPERTIES, map_(props), "peer properties")
        self.server_properties = reply.map()
        self.server_version = parse_version(self.server_properties.get("version"))
        mechanisms = (await self.request(Key.SASL_HANDSHAKE, b"", "SASL handshake")).strings()
        refusal = self.login.not_offered(mechanisms)
        if refusal is not None:
            raise refusal
        try:
            await self._authenticate(self.login.response(), "login")
        except StreamResponseError as err:
            raise (self.login.refused(err) if err.code in _LOGIN_REFUSED else err) from None
        await asyncio.shield(self._tuned)
        opened = await self.request(Key.OPEN, string(self.options.vhost), f"vhost '{self.options.vhost}'")
        # 3.11+ say which node this is, as its clients should reach it (stream.advertised_host/port).
        self.connection_properties = {} if opened.at_end else opened.map()
        if not self._opened.done():  # else lost meanwhile: its reason stands
            self._opened.set_result(None)
        self._renew_token(self._reauthenticate)

    async def _authenticate(self, response: str, about: str) -> None:
        # EXTERNAL's response is empty: RabbitMQ takes an empty one (as the Java client sends) and a null one alike.
        secret = response.encode("utf-8")
        await self.request(Key.SASL_AUTHENTICATE, string(self.login.mechanism) + _SIZE.pack(len(secret)) + secret, about)

    async def _reauthenticate(self, token: Token) -> None:
        """Give the broker a renewed token (``Renewal``): a second PLAIN SaslAuthenticate, for the same user."""
        await self._authenticate(self.login.response(token), RENEWAL)

    # -- asyncio.Protocol ---------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self._tail:
            data = self._tail + data
        view = memoryview(data)
        offset = 0
        total = len(data)
        try:
            if not self._tuned.done() and data[:4] == b"AMQP":
                raise HandshakeFailed(
                    f"the broker does not speak the stream protocol (it answered {data[:8]!r}); is it the stream port (5552)?"
                )
            while total - offset >= 4:
                (size,) = _SIZE.unpack_from(data, offset)
                end = offset + 4 + size
                if end > total:
                    break
                self._on_frame(view[offset + 4 : end])
                offset = end
        except Exception as err:
            self._frames_failed(err)
        finally:
            self._tail = data[offset:] if offset < total else b""

    def _on_frame(self, payload: memoryview) -> None:
        key, _version = _HEAD.unpack_from(payload)
        if key == Key.DELIVER:
            handler = self.subscriptions.get(payload[4])
            if handler is not None:
                handler(payload[5:])
        elif key == Key.PUBLISH_CONFIRM:
            pub = self.publishers.get(payload[4])
            if pub is not None:
                r = Reader(payload, 5)
                pub[0]([r.u64() for _ in range(r.count())])
        elif key == Key.PUBLISH_ERROR:
            pub = self.publishers.get(payload[4])
            if pub is not None:
                r = Reader(payload, 5)
                pub[1]([(r.u64(), r.u16()) for _ in range(r.count())])
        elif key & RESPONSE:
            self._on_response(key & ~RESPONSE, payload)
        elif key == Key.TUNE:
            r = Reader(payload, 4)
            server_frame_max, server_heartbeat = r.u32(), r.u32()
            self.frame_max = min(server_frame_max or FRAME_MAX, FRAME_MAX)
            heartbeat = self._agree_heartbeat(server_heartbeat)
            self.write(frame(Key.TUNE, 1, _SIZE.pack(self.frame_max) + _SIZE.pack(heartbeat)))
            if not self._tuned.done():
                self._tuned.set_result(None)
        elif key == Key.METADATA_UPDATE:
            r = Reader(payload, 4)
            code, stream = r.u16(), r.text()
            if self.on_metadata_update is not None:
                self.on_metadata_update(code, stream)
        elif key == Key.CLOSE:
            r = Reader(payload, 4)
            correlation, code, reason = r.u32(), r.u16(), r.string() or ""
            self.write(command(Key.CLOSE | RESPONSE, correlation, struct.pack(">H", OK)))
            self._lost(ConnectionLost(f"the broker closed the connection: {reason} (code {code:#04x})"))
        # HEARTBEAT needs nothing beyond _last_recv; CONSUMER_UPDATE only comes to single-active consumers.

    def _on_response(self, key: int, payload: memoryview) -> None:
        if key == Key.CREDIT:  # no correlation id: a credit for a subscription the broker does not know
            r = Reader(payload, 4)
            code, sub = r.u16(), r.u8()
            self.abort(StreamResponseError(code, f"credit for subscription {sub}"))
            return
        correlation, code = _CORR.unpack_from(payload, 4)
        waiting = self._pending.pop(correlation, None)
        if waiting is None or waiting[0].done():
            return
        future, about = waiting
        if key == Key.METADATA:  # the one response without a code: each stream has its own
            future.set_result(Reader(payload, 8))
        elif code == OK:
            future.set_result(Reader(payload, 10))
        elif about == RENEWAL and self.options.oauth2 is not None:
            # RabbitMQ answers a refused token late, then closes the socket: the refusal, not the close, ends the connection.
            refused = TokenError(
                f"the broker refused the renewed OAuth 2 token from {self.options.oauth2.source} ({StreamResponseError(code, about)})"
            )
            future.set_exception(refused)
            self.abort(refused)
        else:
            future.set_exception(StreamResponseError(code, about))

    def _fail_waiting(self, reason: AmqpProtocolError) -> None:
        if not self._tuned.done():
            self._tuned.set_exception(reason)
            self._tuned.exception()
        for future, _about in self._pending.values():
            if not future.done():
                future.set_exception(reason)
                future.exception()
        self._pending.clear()

    # -- API ----------------------------------------------------------------------------

    async def request(self, key: int, body: bytes, about: str, version: int = 1) -> Reader:
        """Send a request and wait for its response (``connectionTimeout`` at most); its fields after the code."""
        if self.closed.done():
            raise self.closed.result()
        correlation = next(self._correlations)
        future: asyncio.Future[Reader] = self.loop.create_future()
        self._pending[correlation] = (future, about)
        self.write(command(key, correlation, body, version))
        try:
            return await asyncio.wait_for(future, self.options.connection_timeout)
        except TimeoutError:
            self._pending.pop(correlation, None)
            err = ConnectionLost(f"{about}: no answer from the broker within connectionTimeout={self.options.connection_timeout:g}s")
            self.abort(err)
            raise err from None

    async def create(self, stream: str, arguments: dict[str, str] | None = None) -> None:
        await self.request(Key.CREATE, string(stream) + map_(arguments or {}), f"create stream '{stream}'")

    async def delete(self, stream: str) -> None:
        await self.request(Key.DELETE, string(stream), f"delete stream '{stream}'")

    async def metadata(self, *streams: str) -> dict[str, tuple[int, tuple[str, int] | None]]:
        """Each stream's response code and its leader's (host, port), None when it has none."""
        r = await self.request(Key.METADATA, strings(streams), "metadata")
        brokers = {}
        for _ in range(r.count()):
            ref, host, port = r.u16(), r.text(), r.u32()
            brokers[ref] = (host, port)
        out: dict[str, tuple[int, tuple[str, int] | None]] = {}
        for _ in range(r.count()):
            name, code, leader = r.text(), r.u16(), r.u16()
            for _ in range(r.count()):
                r.u16()
            out[name] = (code, brokers.get(leader))
        return out

    async def stats(self, stream: str) -> dict[str, int]:
        """The stream's ``first_chunk_id``, ``committed_chunk_id`` and the like (RabbitMQ 3.11+)."""
        r = await self.request(Key.STREAM_STATS, string(stream), f"stream '{stream}'")
        return {r.text(): r.i64() for _ in range(r.count())}

    async def partitions(self, super_stream: str) -> list[str]:
        return (await self.request(Key.PARTITIONS, string(super_stream), f"super stream '{super_stream}'")).strings()

    async def subscribe(
        self,
        sub_id: int,
        stream: str,
        offset: tuple[int, int],
        credit: int,
        on_chunk: ChunkHandler,
        properties: dict[str, str] | None = None,
    ) -> None:
        kind, value = offset
        spec = struct.pack(">H", kind) + (struct.pack(">q", value) if kind == 5 else struct.pack(">Q", value) if kind == 4 else b"")
        self.subscriptions[sub_id] = on_chunk
        body = struct.pack(">B", sub_id) + string(stream) + spec + struct.pack(">H", credit) + map_(properties or {})
        try:
            await self.request(Key.SUBSCRIBE, body, f"stream '{stream}'")
        except BaseException:
            self.subscriptions.pop(sub_id, None)
            raise

    def credit(self, sub_id: int, chunks: int) -> None:
        self.write(frame(Key.CREDIT, 1, struct.pack(">BH", sub_id, chunks)))

    async def unsubscribe(self, sub_id: int) -> None:
        """Ends the subscription. One the broker has already ended (its stream's member went in a failover, and the
        metadata update saying so has not come yet) answers 0x04: it is gone all the same."""
        try:
            await self.request(Key.UNSUBSCRIBE, struct.pack(">B", sub_id), f"subscription {sub_id}")
        except StreamResponseError as err:
            if err.code != _NO_SUBSCRIPTION:
                raise
        finally:
            self.subscriptions.pop(sub_id, None)

    async def declare_publisher(self, pub_id: int, reference: str, stream: str, on_confirm: ConfirmHandler, on_error: ErrorHandler) -> None:
        """``reference`` names the producer for deduplication; ``""`` for none (RabbitMQ refuses a null one: unknown frame)."""
        self.publishers[pub_id] = (on_confirm, on_error)
        try:
            await self.request(Key.DECLARE_PUBLISHER, struct.pack(">B", pub_id) + string(reference) + string(stream), f"stream '{stream}'")
        except BaseException:
            self.publishers.pop(pub_id, None)
            raise

    async def publisher_sequence(self, reference: str, stream: str) -> int:
        """The highest publishing id the broker stored for ``reference`` on ``stream`` (0 when none)."""
        r = await self.request(Key.QUERY_PUBLISHER_SEQUENCE, string(reference) + string(stream), f"stream '{stream}'")
        return r.u64()

    def publish(self, pub_id: int, messages: list[tuple[int, bytes]]) -> None:
        """One publish frame: (publishing id, encoded message) pairs; the caller keeps it under ``frame_max``."""
        body = b"".join(struct.pack(">QI", pid, len(m)) + m for pid, m in messages)
        self.write(frame(Key.PUBLISH, 1, struct.pack(">Bi", pub_id, len(messages)) + body))

    def publish_filtered(self, pub_id: int, messages: list[tuple[int, str | None, bytes]]) -> None:
        """Publish version 2 (RabbitMQ 3.13+): (publishing id, filter value or None, encoded message) triples,
        the filter value going into the chunk's Bloom filter for filtered reads."""
        body = b"".join(_ID.pack(pid) + string(value) + _SIZE.pack(len(m)) + m for pid, value, m in messages)
        self.write(frame(Key.PUBLISH, 2, struct.pack(">Bi", pub_id, len(messages)) + body))

    def publish_sub_entries(self, pub_id: int, entries: list[tuple[int, bytes]]) -> None:
        """One publish frame of sub-entries (``compression.encode``), each under the publishing id of its last message;
        the broker confirms each sub-entry once, by that id."""
        body = b"".join(_ID.pack(pid) + entry for pid, entry in entries)
        self.write(frame(Key.PUBLISH, 1, struct.pack(">Bi", pub_id, len(entries)) + body))

    async def delete_publisher(self, pub_id: int) -> None:
        try:
            await self.request(Key.DELETE_PUBLISHER, struct.pack(">B", pub_id), f"publisher {pub_id}")
        finally:
            self.publishers.pop(pub_id, None)

    async def close(self) -> None:
        if self.closed.done():
            return
        try:
            await asyncio.wait_for(self.request(Key.CLOSE, struct.pack(">H", OK) + string("bye"), "close"), CLOSE_TIMEOUT)
        except (TimeoutError, AmqpProtocolError):
            pass  # the connection is going either way; what the broker said about it changes nothing
        self.abort(ConnectionLost("closed"))
