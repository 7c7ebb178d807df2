"""An AMQP 1.0 session: its links by handle, its windows, the delivery ids it hands out, and settlement.

Delivery ids are the session's (RabbitMQ's too): one disposition from the client may settle a range of them,
across the session's links. The client's incoming window bounds the transfers sent: a consumer takes nothing
while it is shut, and its flow opens it again. The broker's own incoming window is large and reopened at half,
so a publisher is bounded by link credit alone. Publishing outcomes are dispositions, held while the broker's
confirms are held (``hold_confirms``, an alarm), as AMQP 0-9-1's confirms are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_amqp import errors
from spark_amqp.amqp10 import performatives as p
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import UInt, UShort, encode

from .amqp10_frames import performative
from .amqp10_links import IncomingLink, OutgoingLink, attach

if TYPE_CHECKING:
    from .amqp10_connection import Amqp10Connection

INCOMING_WINDOW = 1 << 16
OUTGOING_WINDOW = (1 << 32) - 1
HANDLE_MAX = (1 << 32) - 1
_SERIAL = 0xFFFFFFFF


class Session:
    def __init__(self, connection: Amqp10Connection, channel: int, fields: list[Any]) -> None:
        self.connection = connection
        self.channel = channel
        self.open = True
        self.links: dict[int, OutgoingLink | IncomingLink] = {}
        self.unsettled: dict[int, OutgoingLink] = {}  # our delivery id -> the link it went on
        self.next_delivery_id = 0
        self.next_outgoing_id = 0  # transfer ids
        self.next_incoming_id = int(fields[1]) if len(fields) > 1 and fields[1] is not None else 0
        self.remote_window = int(fields[2]) if len(fields) > 2 and fields[2] is not None else 0
        self._incoming_left = INCOMING_WINDOW
        # publishes' (delivery id, outcome, link), held while confirms are
        self._outcomes: list[tuple[int, bytes, IncomingLink]] = []

    def begin(self) -> None:
        fields = [UShort(self.channel), UInt(self.next_outgoing_id), UInt(INCOMING_WINDOW), UInt(OUTGOING_WINDOW), UInt(HANDLE_MAX)]
        self.send(P.BEGIN, fields)

    def send(self, code: int, fields: list[Any]) -> None:
        self.connection.write(performative(self.channel, code, fields))

    def write_frame(self, data: bytes) -> None:
        """A frame ``performatives`` encoded for channel 0, put on this session's channel."""
        if self.channel:
            data = data[:6] + self.channel.to_bytes(2, "big") + data[8:]
        self.connection.write(data)

    @property
    def can_send(self) -> bool:
        return self.open and self.remote_window > 0 and not self.connection.write_paused

    # -- frames ---------------------------------------------------------------------------

    def on_frame(self, frame: p.Frame) -> None:
        code, fields = frame.code, frame.fields
        if code == P.TRANSFER:
            self.on_transfer(fields, frame.payload)
        elif code == P.DISPOSITION:
            self._on_disposition(fields)
        elif code == P.FLOW:
            self._on_flow(fields)
        elif code == P.ATTACH:
            attach(self, fields)
        elif code == P.DETACH:
            link = self.links.pop(int(fields[0]), None)
            if link is not None:
                link.detached(by_detach=True)
                self.send(P.DETACH, [UInt(link.handle), True])
        else:
            raise errors.FrameError(f"unexpected performative {code:#04x}")

    def on_transfer(self, fields: list[Any], payload: bytes) -> None:
        self.next_incoming_id = (self.next_incoming_id + 1) & _SERIAL
        self._incoming_left -= 1
        if self._incoming_left < INCOMING_WINDOW // 2:
            self._incoming_left = INCOMING_WINDOW
            self.flow()
        link = self.links.get(int(fields[0]))
        if not isinstance(link, IncomingLink):
            raise errors.FrameError(f"a transfer on handle {fields[0]}, which is not a link to the broker")
        link.on_transfer(fields, payload)

    def _on_flow(self, fields: list[Any]) -> None:
        next_incoming = int(fields[0]) if fields and fields[0] is not None else 0
        window = int(fields[1]) if len(fields) > 1 and fields[1] is not None else 0
        self.remote_window = (next_incoming + window - self.next_outgoing_id) & _SERIAL
        if self.remote_window > 1 << 31:
            self.remote_window = 0
        handle = fields[4] if len(fields) > 4 else None
        echo = len(fields) > 9 and bool(fields[9])
        if handle is None:
            if echo:
                self.flow()
            self.wake()
            return
        link = self.links.get(int(handle))
        if link is None:
            raise errors.FrameError(f"a flow on handle {handle}, which is not attached")
        self.wake()  # the window may have opened for every link, this one's credit is set below
        link.on_flow(fields)

    def _on_disposition(self, fields: list[Any]) -> None:
        if not fields[0]:
            return  # from a sender: the broker settles what it receives, nothing to do
        first = int(fields[1])
        last = int(fields[2]) if len(fields) > 2 and fields[2] is not None else first
        state = fields[4] if len(fields) > 4 else None
        unsettled = self.unsettled
        touched: dict[OutgoingLink, list[int]] = {}
        delivery_id = first
        while True:
            link = unsettled.pop(delivery_id, None)
            if link is not None:
                touched.setdefault(link, []).append(delivery_id)
            if delivery_id == last:
                break
            delivery_id = (delivery_id + 1) & _SERIAL
        for link, ids in touched.items():
            link.settle(ids, state)

    # -- sending ---------------------------------------------------------------------------

    def flow(self, link_fields: list[Any] | None = None) -> None:
        """A flow frame with the session's state, and a link's when given (handle, delivery-count, credit, ...)."""
        fields: list[Any] = [UInt(self.next_incoming_id), UInt(self._incoming_left), UInt(self.next_outgoing_id), UInt(OUTGOING_WINDOW)]
        self.send(P.FLOW, fields + (link_fields or []))

    def transfer(self, handle: int, payload: bytes, settled: bool) -> int:
        """Send one message on an outgoing link (in frames of the client's size); its delivery id."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) & _SERIAL
        tag = delivery_id.to_bytes(4, "big")
        room = self.connection.max_frame - 64
        if len(payload) <= room:
            self.write_frame(p.transfer(handle, delivery_id, tag, payload, settled))
            frames = 1
        else:
            frames = 0
            for at in range(0, len(payload), room):
                more = at + room < len(payload)
                self.write_frame(p.transfer(handle, delivery_id, tag, payload[at : at + room], settled, more))
                frames += 1
        self.next_outgoing_id = (self.next_outgoing_id + frames) & _SERIAL
        self.remote_window = max(self.remote_window - frames, 0)
        return delivery_id

    def outcome(self, delivery_id: int, state: bytes, link: IncomingLink) -> None:
        """A publish's outcome (settled), held while the broker holds its confirms."""
        self._outcomes.append((delivery_id, state, link))
        self.connection.schedule_flush()

    def release_outcomes(self) -> None:
        """The outcomes decided, one disposition for each run of consecutive ids with the same one (as RabbitMQ)."""
        if not self._outcomes:
            return
        outcomes, self._outcomes = self._outcomes, []
        out = self.connection._out
        first, last, state = outcomes[0][0], outcomes[0][0], outcomes[0][1]
        for delivery_id, next_state, _ in outcomes[1:]:
            if delivery_id == (last + 1) & _SERIAL and next_state == state:
                last = delivery_id
                continue
            out.append(self._disposition(first, last, state))
            first, last, state = delivery_id, delivery_id, next_state
        out.append(self._disposition(first, last, state))
        counts: dict[IncomingLink, int] = {}
        for _, _, link in outcomes:
            counts[link] = counts.get(link, 0) + 1
        for link, count in counts.items():
            link.confirmed(count)

    def _disposition(self, first: int, last: int, state: bytes) -> bytes:
        head = encode(True) + encode(UInt(first)) + encode(UInt(last)) + encode(True) + state
        body = b"\x00\x53\x15\xc0" + bytes((len(head) + 1, 5)) + head if len(head) < 255 else _long_list(head)
        return p.frame(self.channel, body)

    def wake(self) -> None:
        """Credit or window opened: the queues of this session's consumers deliver again."""
        for link in list(self.links.values()):
            if isinstance(link, OutgoingLink):
                link.wake()

    def ended(self) -> None:
        """The session ended (or its connection): links detach, unsettled deliveries go back to their queues."""
        self.open = False
        links = list(self.links.values())
        self.links.clear()
        for link in links:
            link.detached()
        self.unsettled.clear()
        self._outcomes = []


def _long_list(head: bytes) -> bytes:
    return b"\x00\x53\x15\xd0" + (len(head) + 4).to_bytes(4, "big") + (5).to_bytes(4, "big") + head
