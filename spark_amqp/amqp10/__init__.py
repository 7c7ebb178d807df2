"""AMQP 1.0's encoding, which the stream protocol's messages and the AMQP 1.0 client share: ``types`` (the type
system, part 1 of the spec) and ``message`` (a message's sections, part 3), whose names are also here."""

from .message import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    DATA,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    PROPERTY_NAMES,
    Sections,
    encode,
    encode_value_message,
    is_amqp10,
    sections,
)

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
