"""AMQP 1.0's frames and performatives (parts 2 and 5 of the spec): encoded for sending, decoded as they come.

A frame is its size, a data offset (2: no extended header), a type (0 AMQP, 1 SASL) and a channel, then a
performative (a described list) and, for a transfer, the payload: a message's sections. A performative's
fields come and go as a list in the spec's order; trailing nulls are left out, as the spec allows. Numbers
are typed as the spec types them (``UInt``, ``UShort``, ``UByte``): a peer decodes a field by its type.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from ..errors import DecodeError
from .types import Described, Symbol, UByte, UInt, UShort, decode, encode

__all__ = [
    "AMQP_HEADER",
    "HEARTBEAT",
    "SASL_HEADER",
    "Frame",
    "Outcome",
    "Performative",
    "attach",
    "begin",
    "close",
    "detach",
    "disposition",
    "end",
    "error_of",
    "flow",
    "frame",
    "open_",
    "read_frame",
    "read_transfer",
    "sasl_init",
    "transfer",
]

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
AMQP, SASL = 0, 1
FRAME_HEAD = struct.Struct(">IBBH")  # size, data offset (in 4-byte words), type, channel
HEARTBEAT = FRAME_HEAD.pack(8, 2, AMQP, 0)  # an empty frame


class Performative:
    """Descriptor codes (part 2.7 and 5.3)."""

    OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
    ERROR = 0x1D
    RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = range(0x23, 0x28)
    SOURCE, TARGET = 0x28, 0x29
    SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)


class Outcome:
    """A delivery's outcome, as a disposition's state (``accepted`` and its siblings)."""

    ACCEPTED = encode(Described(Performative.ACCEPTED, []))
    RELEASED = encode(Described(Performative.RELEASED, []))

    @staticmethod
    def rejected(condition: str, description: str) -> bytes:
        return encode(Described(Performative.REJECTED, [Described(Performative.ERROR, [Symbol(condition), description])]))

    @staticmethod
    def modified(delivery_failed: bool, undeliverable_here: bool, annotations: dict[Any, Any] | None = None) -> bytes:
        return encode(Described(Performative.MODIFIED, _trim([delivery_failed, undeliverable_here, annotations])))


class Frame(NamedTuple):
    kind: int  # AMQP or SASL
    channel: int
    code: int | None  # the performative's descriptor; None for an empty frame (a heartbeat)
    fields: list[Any]
    payload: bytes  # after the performative: a transfer's message bytes


def frame(channel: int, performative: bytes, payload: bytes = b"", kind: int = AMQP) -> bytes:
    return FRAME_HEAD.pack(8 + len(performative) + len(payload), 2, kind, channel) + performative + payload


def read_frame(data: bytes, start: int, end: int) -> Frame:
    """The frame in ``data[start:end]`` (its size field included)."""
    _size, offset, kind, channel = FRAME_HEAD.unpack_from(data, start)
    at = start + 4 * offset
    if at >= end:
        return Frame(kind, channel, None, [], b"")
    if data[at] != 0x00:
        raise DecodeError("AMQP 1.0: a frame body that is not a described performative")
    descriptor, at = decode(data, at + 1)
    fields, at = decode(data, at)
    if at > end:
        raise DecodeError(f"AMQP 1.0: a performative runs {at - end} bytes past the end of its frame")
    return Frame(kind, channel, _code(descriptor), fields if isinstance(fields, list) else [], data[at:end])


def _code(descriptor: Any) -> int:
    if isinstance(descriptor, int):
        return descriptor
    raise DecodeError(f"AMQP 1.0: a performative described by {descriptor!r}, not a code")


def _trim(fields: list[Any]) -> list[Any]:
    while fields and fields[-1] is None:
        fields.pop()
    return fields


def _performative(code: int, fields: list[Any]) -> bytes:
    return encode(Described(code, _trim(fields)))


def sasl_init(mechanism: str, response: bytes, hostname: str | None) -> bytes:
    return frame(0, _performative(Performative.SASL_INIT, [Symbol(mechanism), response, hostname]), kind=SASL)


def open_(container_id: str, hostname: str | None, max_frame_size: int, idle_time_out_ms: int, properties: dict[Any, Any]) -> bytes:
    fields = [container_id, hostname, UInt(max_frame_size), UShort(0), UInt(idle_time_out_ms) if idle_time_out_ms else None]
    return frame(0, _performative(Performative.OPEN, [*fields, None, None, None, None, properties or None]))


def begin(next_outgoing_id: int, incoming_window: int, outgoing_window: int, handle_max: int) -> bytes:
    fields = [None, UInt(next_outgoing_id), UInt(incoming_window), UInt(outgoing_window), UInt(handle_max)]
    return frame(0, _performative(Performative.BEGIN, fields))


def attach(
    name: str,
    handle: int,
    receiver: bool,
    source: list[Any],
    target: list[Any],
    settled: bool = False,
    initial_delivery_count: int | None = None,
    properties: dict[Any, Any] | None = None,
) -> bytes:
    """A link's attach: ``receiver`` True reads from ``source``; a sender writes to ``target`` (each a field list of
    the terminus). Deliveries are unsettled (acknowledged by a disposition) unless ``settled``; the receiver settles first."""
    fields = [
        name,
        UInt(handle),
        receiver,
        UByte(1 if settled else 0),  # snd-settle-mode: unsettled, or settled
        UByte(0),  # rcv-settle-mode: first
        Described(Performative.SOURCE, _trim(list(source))),
        Described(Performative.TARGET, _trim(list(target))),
        None,
        None,
        None if initial_delivery_count is None else UInt(initial_delivery_count),
        None,
        None,
        None,
        properties,
    ]
    return frame(0, _performative(Performative.ATTACH, fields))


def flow(
    next_incoming_id: int | None,
    incoming_window: int,
    next_outgoing_id: int,
    outgoing_window: int,
    handle: int | None = None,
    delivery_count: int | None = None,
    link_credit: int | None = None,
    drain: bool = False,
    echo: bool = False,
) -> bytes:
    fields: list[Any] = [
        None if next_incoming_id is None else UInt(next_incoming_id),
        UInt(incoming_window),
        UInt(next_outgoing_id),
        UInt(outgoing_window),
    ]
    if handle is not None:
        fields += [UInt(handle), None if delivery_count is None else UInt(delivery_count), UInt(link_credit or 0), None, drain, echo]
    return frame(0, _performative(Performative.FLOW, fields))


_TRANSFER = b"\x00\x53\x14"
_U32 = struct.Struct(">I")
_TRANSFER_HEAD = struct.Struct(">BBBI")  # uint (0x70) delivery id, after the list's size and count and the handle


# The usual transfer, in one pack: a small handle, the delivery id as its own four-byte tag, unsettled, whole. The
# frame's size; doff 2, type 0, channel 0; the descriptor and a list of 16 bytes and 5 fields, the handle's code; the
# handle; the id's code; the id; the tag's code and size; the tag; message format 0 and settled false.
_USUAL = struct.Struct(">I11sBBI2sI2s")
_USUAL_HEAD = b"\x02\x00\x00\x00\x00\x53\x14\xc0\x10\x05\x52"


def usual_transfer(handle: int, delivery_id: int, payload: bytes) -> bytes:
    """``transfer`` of a whole unsettled message on a link whose handle is below 256, tagged with its delivery id."""
    return _USUAL.pack(29 + len(payload), _USUAL_HEAD, handle, 0x70, delivery_id, b"\xa0\x04", delivery_id, b"\x43\x42") + payload


def transfer(handle: int, delivery_id: int, tag: bytes, payload: bytes, settled: bool = False, more: bool = False) -> bytes:
    """A transfer, encoded by hand: every message a sender publishes pays for this, so no generic encoding. Fields:
    handle (a small uint), delivery id (a uint), the tag (binary), message format 0, settled, and more if set."""
    fields = b"".join(
        (
            b"\x52" + bytes((handle,)) if handle < 256 else b"\x70" + _U32.pack(handle),
            b"\x70" + _U32.pack(delivery_id),
            b"\xa0" + bytes((len(tag),)) + tag,
            b"\x43",
            b"\x41" if settled else b"\x42",
            b"\x41" if more else b"",
        )
    )
    performative = _TRANSFER + b"\xc0" + bytes((len(fields) + 1, 6 if more else 5)) + fields
    return FRAME_HEAD.pack(8 + len(performative) + len(payload), 2, AMQP, 0) + performative + payload


def read_transfer(data: bytes, start: int, end: int) -> tuple[int, int | None, bool, bytes] | None:
    """(handle, delivery id, more, payload) of the transfer frame at ``data[start:end]``, read by hand where the
    broker encodes it as RabbitMQ does (a small list of at most six fields; the uints small, zero or whole; more as
    one byte); None when it is encoded otherwise or is not a transfer (``read_frame`` reads it then)."""
    at = start + 8  # the frame's header, with a data offset of 2
    if data[start + 4] != 2 or data[at : at + 3] != _TRANSFER or data[at + 3] != 0xC0:
        return None
    size, count = data[at + 4], data[at + 5]
    list_end = at + 5 + size
    if count > 6 or list_end > end:
        return None
    at += 6
    values: list[int | None] = []
    for _ in range(min(count, 2)):
        code = data[at]
        if code == 0x52:
            values.append(data[at + 1])
            at += 2
        elif code == 0x70:
            values.append(_U32.unpack_from(data, at + 1)[0])
            at += 5
        elif code == 0x43:
            values.append(0)
            at += 1
        elif code == 0x40:
            values.append(None)
            at += 1
        else:
            return None
    if not values or values[0] is None:
        return None
    more = False
    if count == 6:
        flag = data[list_end - 1]
        if flag not in (0x40, 0x41, 0x42):
            return None
        more = flag == 0x41
    return values[0], values[1] if len(values) > 1 else None, more, data[list_end:end]


def disposition(first: int, last: int, state: bytes, settled: bool = True, receiver: bool = True) -> bytes:
    """Settles deliveries ``first`` to ``last`` (delivery ids) with one outcome (``Outcome``)."""
    head = encode(receiver) + encode(UInt(first)) + encode(UInt(last)) + encode(settled) + state
    return frame(0, b"\x00\x53\x15" + _list(head, 5))


def _list(body: bytes, count: int) -> bytes:
    if len(body) + 1 < 256:
        return b"\xc0" + struct.pack(">BB", len(body) + 1, count) + body
    return b"\xd0" + struct.pack(">II", len(body) + 4, count) + body


def detach(handle: int, closed: bool = True) -> bytes:
    return frame(0, _performative(Performative.DETACH, [UInt(handle), closed]))


def end() -> bytes:
    return frame(0, _performative(Performative.END, []))


def close() -> bytes:
    return frame(0, _performative(Performative.CLOSE, []))


def error_of(fields: list[Any], index: int) -> tuple[str, str] | None:
    """The (condition, description) of the error in field ``index`` (a detach's, end's, close's, rejected's), if any."""
    error = fields[index] if len(fields) > index else None
    if not isinstance(error, Described) or not isinstance(error.value, list) or not error.value:
        return None
    condition = str(error.value[0])
    description = error.value[1] if len(error.value) > 1 and isinstance(error.value[1], str) else ""
    return condition, description
