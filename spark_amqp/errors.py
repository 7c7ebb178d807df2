"""The connector's exceptions: one small hierarchy, and AMQP reply codes mapped to names.

Every message is written for the person running the Spark job: it names the
option, queue or value at fault and never contains a password.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = [
    "REPLY_CODES",
    "AmqpConnectorError",
    "AmqpOptionError",
    "AmqpPublishError",
    "AmqpSourceError",
    "reply_name",
]


class AmqpConnectorError(Exception):
    """Base class of every error raised by spark-amqp."""


class AmqpOptionError(AmqpConnectorError, ValueError):
    """An option is missing, unknown or has a value that cannot work."""


class AmqpSourceError(AmqpConnectorError):
    """The source cannot consume (missing queue, refused login, fatal channel error)."""


class AmqpPublishError(AmqpConnectorError):
    """The sink could not get broker confirmation for every message it published."""


REPLY_CODES = MappingProxyType(
    {
        200: "REPLY_SUCCESS",
        311: "CONTENT_TOO_LARGE",
        312: "NO_ROUTE",
        313: "NO_CONSUMERS",
        320: "CONNECTION_FORCED",
        402: "INVALID_PATH",
        403: "ACCESS_REFUSED",
        404: "NOT_FOUND",
        405: "RESOURCE_LOCKED",
        406: "PRECONDITION_FAILED",
        501: "FRAME_ERROR",
        502: "SYNTAX_ERROR",
        503: "COMMAND_INVALID",
        504: "CHANNEL_ERROR",
        505: "UNEXPECTED_FRAME",
        506: "RESOURCE_ERROR",
        530: "NOT_ALLOWED",
        540: "NOT_IMPLEMENTED",
        541: "INTERNAL_ERROR",
    }
)


def reply_name(code: int) -> str:
    return REPLY_CODES.get(code, f"REPLY_{code}")
