"""AMQP 1.0 messages as RabbitMQ stores them in a stream: a run of described sections.

``encode`` writes one (the sink's publishes); ``sections`` reads one back into its parts.
A record that does not start with a section descriptor is not an AMQP 1.0 message
(rstream's binary mode writes such records): ``sections`` says so and the reader keeps
its bytes as the body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import DecodeError
from .types import Described, decode
from .types import encode as encode_value

__all__ = [
    "AMQP_SEQUENCE",
    "AMQP_VALUE",
    "DATA",
    "HEADER",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "Sections",
    "encode",
    "encode_value_message",
    "is_amqp10",
    "sections",
]

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78
# The properties section is a list in this order (AMQP 1.0, 3.2.4).
PROPERTY_NAMES = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
_SECTION_CODES = {
    HEADER,
    DELIVERY_ANNOTATIONS,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    APPLICATION_PROPERTIES,
    DATA,
    AMQP_SEQUENCE,
    AMQP_VALUE,
    FOOTER,
}


@dataclass
class Sections:
    """One message's sections; ``body`` joins its data sections (None when it has none)."""

    header: list[Any] = field(default_factory=list)
    annotations: dict[Any, Any] = field(default_factory=dict)
    properties: list[Any] = field(default_factory=list)
    application_properties: dict[Any, Any] = field(default_factory=dict)
    body: bytes | None = None
    value: Any = None  # an amqp-value or amqp-sequence body

    def property(self, name: str) -> Any:
        """A property by its name in ``PROPERTY_NAMES`` (None when the message leaves it out)."""
        index = _PROPERTY_INDEX[name]
        return self.properties[index] if index < len(self.properties) else None


_PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTY_NAMES)}
# A section's descriptor may also be its symbolic name.
_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


def _descriptor(value: Any) -> int | None:
    """The section code of a described value (a ulong, or its symbolic name's code)."""
    return value if isinstance(value, int) else _SECTION_NAMES.get(str(value))


def is_amqp10(record: bytes) -> bool:
    """Whether the record starts as an AMQP 1.0 message does: a section descriptor (0x00 0x53 0x70…0x78)."""
    return len(record) >= 3 and record[0] == 0x00 and record[1] == 0x53 and record[2] in _SECTION_CODES


def sections(record: bytes) -> Sections:
    """The message's sections; ``DecodeError`` if it is not a whole AMQP 1.0 message."""
    out = Sections()
    pos = 0
    chunks: list[bytes] = []
    while pos < len(record):
        value, pos = decode(record, pos)
        if not isinstance(value, Described):
            raise DecodeError(f"AMQP 1.0 message: a {type(value).__name__} where a section should be")
        code = _descriptor(value.descriptor)
        if code == DATA:
            chunks.append(bytes(value.value))
        elif code == HEADER:
            out.header = list(value.value or [])
        elif code == MESSAGE_ANNOTATIONS:
            out.annotations = dict(value.value or {})
        elif code == PROPERTIES:
            out.properties = list(value.value or [])
        elif code == APPLICATION_PROPERTIES:
            out.application_properties = dict(value.value or {})
        elif code in (AMQP_VALUE, AMQP_SEQUENCE):
            out.value = value.value
        elif code is None:
            raise DecodeError(f"AMQP 1.0 message: unknown section {value.descriptor!r}")
        # delivery annotations and the footer are for the hop that sent it
    if chunks:
        out.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return out


def encode(
    body: bytes,
    *,
    header: list[Any] | None = None,
    annotations: dict[Any, Any] | None = None,
    properties: list[Any] | None = None,
    application_properties: dict[str, Any] | None = None,
) -> bytes:
    """A message with the sections given (empty ones left out) and one data section."""
    parts = []
    if header:
        parts.append(b"\x00\x53\x70" + encode_value(_trimmed(header)))
    if annotations:
        parts.append(b"\x00\x53\x72" + encode_value(annotations))
    if properties and any(p is not None for p in properties):
        parts.append(b"\x00\x53\x73" + encode_value(_trimmed(properties)))
    if application_properties:
        parts.append(b"\x00\x53\x74" + encode_value(application_properties))
    parts.append(b"\x00\x53\x75" + encode_value(body))
    return b"".join(parts)


def encode_value_message(value: Any, properties: list[Any]) -> bytes:
    """A message of ``properties`` and an amqp-value body (a request to RabbitMQ's management node)."""
    head = b"\x00\x53\x73" + encode_value(_trimmed(properties)) if any(p is not None for p in properties) else b""
    return head + b"\x00\x53\x77" + encode_value(value)


def _trimmed(values: list[Any]) -> list[Any]:
    """A list section without its trailing nulls (AMQP 1.0 lets them go, and RabbitMQ writes them so)."""
    end = len(values)
    while end and values[end - 1] is None:
        end -= 1
    return values[:end]
