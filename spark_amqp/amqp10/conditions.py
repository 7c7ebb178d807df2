"""AMQP 1.0's error conditions (part 2.8.15 and on) as the package's exceptions: one table, onto the classes AMQP
0-9-1's reply codes map to, so that what an error means (and whether it is worth a retry, ``errors.is_transient``)
does not depend on the protocol that said it."""

from __future__ import annotations

from types import MappingProxyType

from ..errors import (
    AccessRefused,
    AmqpReplyError,
    ConnectionForced,
    FrameError,
    InternalError,
    NotAllowed,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    ResourceError,
    ResourceLocked,
    SyntaxError_,
)

__all__ = ["CONDITIONS", "error_for"]

CONDITIONS: MappingProxyType[str, type[AmqpReplyError]] = MappingProxyType(
    {
        "amqp:not-found": NotFound,
        "amqp:unauthorized-access": AccessRefused,
        "amqp:resource-locked": ResourceLocked,
        "amqp:precondition-failed": PreconditionFailed,
        "amqp:resource-deleted": NotFound,
        "amqp:resource-limit-exceeded": ResourceError,
        "amqp:internal-error": InternalError,
        "amqp:not-implemented": NotImplemented_,
        "amqp:not-allowed": NotAllowed,
        "amqp:invalid-field": SyntaxError_,
        "amqp:decode-error": FrameError,
        "amqp:frame-size-too-small": FrameError,
        "amqp:illegal-state": PreconditionFailed,
        "amqp:connection:forced": ConnectionForced,
        "amqp:connection:framing-error": FrameError,
        "amqp:connection:redirect": ConnectionForced,
        "amqp:session:window-violation": FrameError,
        "amqp:session:errant-link": FrameError,
        "amqp:session:handle-in-use": FrameError,
        "amqp:session:unattached-handle": FrameError,
        "amqp:link:detach-forced": ConnectionForced,
        "amqp:link:transfer-limit-exceeded": ResourceError,
        "amqp:link:message-size-exceeded": PreconditionFailed,
        "amqp:link:redirect": ConnectionForced,
        "amqp:link:stolen": ResourceLocked,
    }
)


def error_for(condition: str, description: str, on_connection: bool) -> AmqpReplyError:
    """The exception for an error the broker gave (a close's, an end's, a detach's); its text keeps the condition."""
    cls = CONDITIONS.get(condition, InternalError if condition.startswith("amqp:") else PreconditionFailed)
    text = f"{condition}: {description}" if description else condition
    return cls(text, on_connection=on_connection)
