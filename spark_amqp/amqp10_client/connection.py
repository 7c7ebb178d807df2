"""``Amqp10Client``: one AMQP 1.0 connection on asyncio, with one session: a ``transport.Connection``.

The transport dials, secures, logs in (SASL: its mechanism and response come from ``transport.login``), keeps
heartbeats (empty frames) and renews a token. Here: the SASL and AMQP protocol headers, ``open`` and ``begin``,
links attached by name (the broker answers with a handle of its own, which its frames then carry), credit and
session windows, and the frames' way to their link. Every ending is one exception on ``closed``; a peer that
answers the AMQP 1.0 header with another protocol's (RabbitMQ 3.x without its AMQP 1.0 plugin answers with AMQP
0-9-1's) is a ``HandshakeFailed`` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import urllib.parse
import uuid
from typing import Any

from ..amqp10 import performatives as p
from ..amqp10.conditions import error_for
from ..amqp10.performatives import Performative as P
from ..amqp10.types import Symbol
from ..errors import AccessRefused, AmqpProtocolError, ConnectionForced, ConnectionLost, DecodeError, HandshakeFailed, TokenError
from ..explain import CREDENTIAL_EXPIRED
from ..transport.connection import CLOSE_TIMEOUT, Connection, parse_version
from ..transport.login import Login
from ..transport.options import ConnectionOptions
from ..transport.tokens import Token
from .links import DeliveryHandler, Link, OutcomeHandler, Receiver, Sender, serial_ids
from .management import Management

__all__ = ["Amqp10Client"]

MAX_FRAME = 1 << 20
# Transfers the broker may send before this client opens the session's window again (it does at half).
INCOMING_WINDOW = 1 << 20
OUTGOING_WINDOW = (1 << 32) - 1
HANDLE_MAX = 255
_SIZE = struct.Struct(">I")
_AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"


class Amqp10Client(Connection):
    def __init__(self, loop: asyncio.AbstractEventLoop, options: ConnectionOptions, client_name: str, login: Login | None = None) -> None:
        super().__init__(loop, options, client_name, login)
        self.server_properties: dict[Any, Any] = {}
        self.max_frame = MAX_FRAME
        self._phase = "sasl header"  # -> sasl -> amqp header -> open -> begin -> running
        self._links: dict[int, Link] = {}  # by our handle
        self._remote: dict[int, Link] = {}  # by the broker's handle
        self._handles = itertools.count()
        self._next_delivery = 0  # our delivery ids (sender links)
        self._outgoing: dict[int, Sender] = {}  # unsettled delivery id -> its link
        self.next_outgoing_id = 0  # transfer ids
        self.next_incoming_id = 0
        self._incoming_left = INCOMING_WINDOW
        self._closing = False
        self._management: Management | None = None

    # -- the handshake ---------------------------------------------------------------------------

    def _greet(self) -> None:
        self.write(p.SASL_HEADER)

    def _heartbeat_frame(self) -> bytes:
        return p.HEARTBEAT

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self._tail:
            data = self._tail + data
        offset, total = 0, len(data)
        try:
            while offset < total:
                if self._phase in ("sasl header", "amqp header"):
                    if total - offset < 8:
                        break
                    self._on_header(data[offset : offset + 8])
                    offset += 8
                    continue
                if total - offset < 8:
                    break
                (size,) = _SIZE.unpack_from(data, offset)
                if size < 8 or size > MAX_FRAME:
                    raise DecodeError(f"AMQP 1.0: a frame of {size} bytes (the largest this client takes: {MAX_FRAME})")
                if total - offset < size:
                    break
                # Most frames on a busy receiver are transfers: read by hand, without a generic decode.
                fast = p.read_transfer(data, offset, offset + size) if self._phase == "running" else None
                if fast is not None:
                    self._on_transfer(*fast)
                else:
                    self._on_frame(p.read_frame(data, offset, offset + size))
                offset += size
        except Exception as err:
            self._frames_failed(err)
        finally:
            self._tail = data[offset:] if offset < total else b""

    def _on_header(self, header: bytes) -> None:
        expected = p.SASL_HEADER if self._phase == "sasl header" else p.AMQP_HEADER
        if header == expected:
            self._phase = "sasl" if self._phase == "sasl header" else "open"
            return
        if header == _AMQP091_HEADER:
            raise HandshakeFailed(
                "the broker answered the AMQP 1.0 protocol header with AMQP 0-9-1's: it does not speak AMQP 1.0 (RabbitMQ "
                "3.x needs its rabbitmq_amqp1_0 plugin; 4.x speaks it on the same port): speak AMQP 0-9-1 to it (leave option "
                "'protocol' out)"
            )
        raise HandshakeFailed(f"the broker answered the AMQP 1.0 protocol header with {header!r}: it does not speak AMQP 1.0 here")

    def _on_sasl(self, frame: p.Frame) -> None:
        if frame.code == P.SASL_MECHANISMS:
            offered = frame.fields[0] if frame.fields else []
            mechanisms = [str(m) for m in (offered if isinstance(offered, list) else [offered])]
            refusal = self.login.not_offered(mechanisms)
            if refusal is not None:
                raise refusal
            hostname = f"vhost:{self.options.vhost}"
            self.write(p.sasl_init(self.login.mechanism, self.login.response().encode("utf-8"), hostname))
        elif frame.code == P.SASL_OUTCOME:
            code = frame.fields[0] if frame.fields else 1
            if code != 0:
                refused = AccessRefused(f"Login was refused using authentication mechanism {self.login.mechanism} (SASL outcome {code})")
                raise self.login.refused(refused)
            self._phase = "amqp header"
            self.write(p.AMQP_HEADER)
            idle_ms = int(self.options.heartbeat * 1000)
            # Symbols, as the standard has them: RabbitMQ shows a connection's properties only when their keys are.
            properties = {Symbol("product"): "spark-amqp", Symbol("connection_name"): self.client_name}
            self.write(p.open_(f"spark-amqp-{uuid.uuid4()}", f"vhost:{self.options.vhost}", MAX_FRAME, idle_ms, properties))

    # -- frames ------------------------------------------------------------------------------------

    def _on_frame(self, frame: p.Frame) -> None:
        if frame.kind == 1:
            self._on_sasl(frame)
            return
        code = frame.code
        if code is None:
            return  # a heartbeat: _last_recv has it
        if code == P.TRANSFER:
            fields = frame.fields
            more = len(fields) > 5 and bool(fields[5])
            self._on_transfer(fields[0], fields[1] if len(fields) > 1 else None, more, frame.payload)
        elif code == P.DISPOSITION:
            self._on_disposition(frame.fields)
        elif code == P.FLOW:
            self._on_flow(frame.fields)
        elif code == P.ATTACH:
            self._on_attach(frame.fields)
        elif code == P.DETACH:
            self._on_detach(frame.fields)
        elif code == P.OPEN:
            self._on_open(frame.fields)
        elif code == P.BEGIN:
            self._phase = "running"
            self.next_incoming_id = frame.fields[1] if len(frame.fields) > 1 else 0
            if not self._opened.done():
                self._opened.set_result(None)
        elif code in (P.END, P.CLOSE):
            error = p.error_of(frame.fields, 0)
            if code == P.CLOSE and not self._closing:
                self.write(p.close())
            reason: AmqpProtocolError = (
                error_for(*error, on_connection=True) if error else ConnectionLost("the broker closed the connection")
            )
            if isinstance(reason, AccessRefused) and CREDENTIAL_EXPIRED in reason.text:
                # A login that expired on an open connection is no refusal: a new connection logs in again (as the
                # 320 RabbitMQ closes an AMQP 0-9-1 connection with, for the same reason).
                reason = ConnectionForced(reason.text, on_connection=True)
            elif isinstance(reason, AccessRefused) and "credential update failed" in reason.text and self.options.oauth2 is not None:
                # RabbitMQ answers a refused PUT /auth/tokens by closing the connection.
                reason = TokenError(f"the broker refused the renewed OAuth 2 token from {self.options.oauth2.source} ({reason})")
            self._lost(reason)

    def _on_open(self, fields: list[Any]) -> None:
        # The largest frame the broker takes: what this client sends is cut to it (ours, MAX_FRAME, is what it takes).
        self.max_frame = min(1 << 24, fields[2]) if len(fields) > 2 and fields[2] else MAX_FRAME
        peer_idle_ms = fields[4] if len(fields) > 4 and fields[4] else 0
        self.server_properties = fields[9] if len(fields) > 9 and isinstance(fields[9], dict) else {}
        self.server_version = parse_version(self.server_properties.get("version"))
        # Frames at least every half of the broker's idle timeout; its silence for our own is an end.
        ours = float(self.options.heartbeat)
        send_every = peer_idle_ms / 2000 if peer_idle_ms else ours / 2
        self._start_heartbeats(min(send_every, ours / 2) if ours else send_every, ours or float("inf"))
        self._phase = "begin"
        self.write(p.begin(self.next_outgoing_id, INCOMING_WINDOW, OUTGOING_WINDOW, HANDLE_MAX))
        self._renew_token(self._renew)

    def _on_attach(self, fields: list[Any]) -> None:
        # By name and role: a link pair (RabbitMQ's management node) shares one name; the broker's role is the other end's.
        ours_receives = not fields[2]
        link = next((lk for lk in self._links.values() if lk.name == fields[0] and isinstance(lk, Receiver) == ours_receives), None)
        if link is None:
            return
        self._remote[fields[1]] = link
        if len(fields) > 9 and fields[9] is not None:
            link.delivery_count = fields[9]  # a sending broker's initial delivery-count
        if not link.attached.done():
            link.attached.set_result(fields)

    def _on_detach(self, fields: list[Any]) -> None:
        link = self._remote.pop(fields[0], None)
        if link is None:
            return
        self._links.pop(link.handle, None)
        error = p.error_of(fields, 2)
        if not link.detaching:  # the broker ended it: answer (else this is the answer to ours)
            self.write(p.detach(link.handle))
        link._end(error_for(*error, on_connection=False) if error else None)

    def _on_transfer(self, handle: int, delivery_id: int | None, more: bool, payload: bytes) -> None:
        self.next_incoming_id = (self.next_incoming_id + 1) & 0xFFFFFFFF  # a serial number (4.0 starts just below 2^32)
        self._incoming_left -= 1
        if self._incoming_left < INCOMING_WINDOW // 2:
            self._incoming_left = INCOMING_WINDOW
            self.write(p.flow(self.next_incoming_id, INCOMING_WINDOW, self.next_outgoing_id, OUTGOING_WINDOW))
        link = self._remote.get(handle)
        if isinstance(link, Receiver):
            link._transfer(delivery_id, more, payload)

    def _on_flow(self, fields: list[Any]) -> None:
        if len(fields) > 6 and fields[4] is not None:
            link = self._remote.get(fields[4])
            if isinstance(link, Sender):
                link._flow(fields[5], fields[6] or 0)
            elif isinstance(link, Receiver):
                link._flow(fields[5], fields[6] or 0, fields[7] if len(fields) > 7 else None)

    def _on_disposition(self, fields: list[Any]) -> None:
        first = fields[1]
        last = fields[2] if len(fields) > 2 and fields[2] is not None else first
        state = fields[4] if len(fields) > 4 else None
        code = getattr(state, "descriptor", None)
        values = getattr(state, "value", None) or []
        code = code if isinstance(code, int) else -1
        # One call per run of ids on the same link: a range covers thousands of a publisher's messages.
        run_first, run_sender = first, None
        previous = first
        for delivery_id in serial_ids(first, last):
            sender = self._outgoing.pop(delivery_id, None)
            if sender is not run_sender:
                if run_sender is not None:
                    run_sender.on_outcome(run_first, previous, code, values)
                run_first, run_sender = delivery_id, sender
            previous = delivery_id
        if run_sender is not None:
            run_sender.on_outcome(run_first, last, code, values)

    def _fail_waiting(self, reason: AmqpProtocolError) -> None:
        for link in list(self._links.values()):
            link._end(reason)
        self._links.clear()
        self._remote.clear()

    # -- API ----------------------------------------------------------------------------------------------

    @property
    def rabbitmq(self) -> bool:
        return str(self.server_properties.get("product", "")).lower() == "rabbitmq"

    def queue_address(self, queue: str) -> str:
        """Where ``queue`` is: RabbitMQ's address v2 (``/queues/<percent-encoded name>``), else the name itself."""
        return f"/queues/{urllib.parse.quote(queue, safe='')}" if self.rabbitmq else queue

    async def receiver(
        self,
        address: str,
        on_delivery: DeliveryHandler,
        filters: dict[Any, Any] | None = None,
        name: str | None = None,
        settled: bool = False,
        properties: dict[Any, Any] | None = None,
    ) -> Receiver:
        """A link reading ``address`` (``/queues/q`` on RabbitMQ), attached; no credit yet (``grant``). ``settled``: the
        broker settles what it sends (nothing to settle here); ``name`` and ``properties``: the link's own."""
        handle = next(self._handles)
        link = Receiver(self, handle, name or f"spark-amqp-receiver-{handle}", address, on_delivery)
        # A queue elsewhere than RabbitMQ (Artemis: an anycast address) is asked for by its capability.
        capabilities = None if self.rabbitmq else Symbol("queue")
        source = [address, None, None, None, None, None, None, filters or None, None, None, capabilities]
        target = [address] if name is not None else []
        await self._attach(link, p.attach(link.name, handle, True, source, target, settled, properties=properties))
        return link

    async def sender(
        self,
        address: str | None,
        on_outcome: OutcomeHandler,
        capability: str | None = None,
        name: str | None = None,
        settled: bool = False,
        properties: dict[Any, Any] | None = None,
    ) -> Sender:
        """A link writing to ``address`` (``/queues/q``, ``/exchanges/e/key``; None: each message's ``to``), attached.
        ``capability``: what the address must be, where the broker makes it on first use (Artemis: ``queue``, an
        anycast queue of that name; ``topic``, a multicast address). ``settled``: messages go settled, without
        outcomes; ``name`` and ``properties``: the link's own."""
        handle = next(self._handles)
        link = Sender(self, handle, name or f"spark-amqp-sender-{handle}", address or "", on_outcome, settled)
        target = [address, None, None, None, None, None, Symbol(capability)] if capability else [address]
        source = [address] if name is not None else []
        frame = p.attach(link.name, handle, False, source, target, settled, initial_delivery_count=0, properties=properties)
        await self._attach(link, frame)
        return link

    async def _attach(self, link: Link, frame: bytes) -> None:
        if self.closed.done():
            raise self.closed.result()
        self._links[link.handle] = link
        self.write(frame)
        try:
            fields = await asyncio.wait_for(asyncio.shield(link.attached), self.options.connection_timeout)
        except TimeoutError:
            raise ConnectionLost(f"no answer to attaching '{link.address}' within connectionTimeout") from None
        terminus = fields[5] if link.__class__ is Receiver else fields[6]
        if terminus is None:  # refused: the broker's detach follows with why
            reason = await asyncio.wait_for(asyncio.shield(link.closed), self.options.connection_timeout)
            raise reason or ConnectionLost(f"the broker refused to attach '{link.address}'")

    def flow(self, link: Receiver, credit: int, drain: bool, echo: bool = False) -> None:
        self.write(
            p.flow(
                self.next_incoming_id,
                INCOMING_WINDOW,
                self.next_outgoing_id,
                OUTGOING_WINDOW,
                link.handle,
                link.delivery_count,
                credit,
                drain,
                echo,
            )
        )

    def next_delivery_id(self) -> int:
        delivery_id = self._next_delivery
        self._next_delivery = (delivery_id + 1) & 0xFFFFFFFF
        self.next_outgoing_id = (self.next_outgoing_id + 1) & 0xFFFFFFFF
        return delivery_id

    def track(self, delivery_id: int, sender: Sender) -> None:
        self._outgoing[delivery_id] = sender

    def advance_delivery_ids(self, count: int, sender: Sender) -> None:
        """``count`` ids from the next, which ``sender`` has just sent unsettled (ids that do not wrap)."""
        first = self._next_delivery
        self._outgoing.update(zip(range(first, first + count), itertools.repeat(sender)))
        self._next_delivery = (first + count) & 0xFFFFFFFF
        self.next_outgoing_id = (self.next_outgoing_id + count) & 0xFFFFFFFF

    async def management_request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status code, body) of RabbitMQ's management node's answer (``management.Management``)."""
        if self._management is None:
            self._management = Management(self)
        return await self._management.request(method, path, body)

    async def _renew(self, token: Token) -> None:
        """A renewed OAuth 2 token for RabbitMQ (``Renewal``): ``PUT /auth/tokens`` on its management node."""
        try:
            status, answer = await self.management_request("PUT", "/auth/tokens", token.value.encode("utf-8"))
        except ConnectionLost as err:
            self.abort(err)  # a broker that does not answer will not keep the connection past the token's expiry either
            raise
        if status not in (200, 204):
            assert self.options.oauth2 is not None
            raise TokenError(f"the broker refused the renewed OAuth 2 token from {self.options.oauth2.source} ({status}: {answer})")

    async def close(self) -> None:
        if self.closed.done():
            return
        self._closing = True
        self.write(p.close())
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), CLOSE_TIMEOUT)
        except TimeoutError:
            self.abort(ConnectionLost("closed"))
