"""The connector's exceptions: one hierarchy, and one table from AMQP reply codes to classes.

Every message is written for the person running the Spark job: it names the
option, queue or value at fault and never contains a password.

Whether a failure is worth retrying is decided here and only here, by
``is_transient``: from the exception's class, and for two codes from the close
itself: a 406 no method caused, or whose text says a stream's replica on that
node is not running; a 541 that names a deprecated feature. The client
raises these classes when the broker closes a channel or connection; the
embedded broker raises the same classes to close them. ``explain`` (in
``explain.py``, importable from here) turns any of them into advice.
"""

from __future__ import annotations

import re
import ssl
from types import MappingProxyType
from typing import Any, ClassVar

__all__ = [
    "NO_LOCAL_REPLICA",
    "REPLY_CODES",
    "AccessRefused",
    "AllEndpointsFailed",
    "AmqpConnectorError",
    "AmqpOptionError",
    "AmqpProtocolError",
    "AmqpPublishError",
    "AmqpReplyError",
    "AmqpSourceError",
    "BrokerUnreachable",
    "CallbackFailed",
    "ConnectionLost",
    "DecodeError",
    "HandshakeFailed",
    "LoginRefused",
    "NotAllowed",
    "NotFound",
    "OtherConsumers",
    "PreconditionFailed",
    "ResourceLocked",
    "StreamInQueueMode",
    "StreamResponseError",
    "TokenError",
    "TokenUnavailable",
    "Unchecked",
    "explain",
    "is_transient",
    "method_name",
    "reply_error",
    "reply_name",
]


class AmqpConnectorError(Exception):
    """Base class of every error raised by spark-amqp."""


class AmqpOptionError(AmqpConnectorError, ValueError):
    """An option, column or value is missing, unknown or cannot work."""


class AmqpSourceError(AmqpConnectorError):
    """The source cannot consume (missing queue, refused login, fatal channel error)."""


class BrokerUnreachable(AmqpSourceError):
    """A transient fault (connection refused or lost, no answer) that outlasted ``connectionTimeout``:
    fatal when a query starts, waited out with backoff once it has reached the broker."""


class Unchecked(BrokerUnreachable):
    """The broker answers, but what decides whether reading on would skip messages cannot be asked where it must be (the
    stream protocol's port, asked what RabbitMQ did not deliver over AMQP): waited out as an outage is, and then the
    query fails with this message, which says what was not delivered and what to change (``Outage.check``)."""


class AmqpPublishError(AmqpConnectorError):
    """The sink could not get broker confirmation for every message it published."""


class AmqpProtocolError(AmqpConnectorError):
    """A failure on an AMQP connection; ``transient`` when the same call may work if retried."""

    retryable: ClassVar[bool] = False

    @property
    def transient(self) -> bool:
        return self.retryable


class ConnectionLost(AmqpProtocolError):
    """The socket closed, reset, timed out or stopped sending heartbeats; reconnecting may work."""

    retryable = True


class AllEndpointsFailed(ConnectionLost):
    """Every endpoint of the uri failed, each with a transient fault, in one round of a connection's walk."""

    def __init__(self, failures: tuple[tuple[str, str], ...]) -> None:
        super().__init__("cannot connect to any of " + ", ".join(f"{where} ({reason})" for where, reason in failures))
        self.failures = failures  # (endpoint, its reason), in the order tried


class HandshakeFailed(AmqpProtocolError):
    """The peer is not an AMQP 0-9-1 broker, or TLS failed (wrong port, untrusted certificate)."""


class LoginRefused(AmqpProtocolError):
    """A login the broker refused that a password cannot fix: a client certificate (SASL EXTERNAL) it does
    not accept, or no offer of the mechanism the options call for. Its message is whole: what was tried
    and the option to change."""


class TokenError(AmqpProtocolError):
    """No usable OAuth 2 token: the token endpoint or provider refused or answered nonsense, or the broker
    refused the token, at login or at renewal. The message says "token" and names the option, never the
    token or the client secret."""


class TokenUnavailable(TokenError):
    """The token endpoint could not be reached, or failed on its side (5xx): asking again later may work."""

    retryable = True


class CallbackFailed(AmqpProtocolError):
    """Code run on a frame from the broker (a delivery handler) raised: a bug, not a broker fault; ``__cause__`` has it."""


class OtherConsumers(AmqpProtocolError):
    """A queue that must have one consumer (an exactly-once query's) has more: found by counting,
    since quorum queues accept a second consumer however ``exclusive`` its ``basic.consume``."""

    def __init__(self, queue: str, consumers: int) -> None:
        super().__init__(f"queue '{queue}' has {consumers} consumers, this query's included")
        self.queue = queue
        self.consumers = consumers


class StreamInQueueMode(AmqpProtocolError):
    """Option ``queue`` names a stream queue: a consumer without ``x-stream-offset`` would start at
    the stream's end and never see what it already holds."""

    def __init__(self, queue: str) -> None:
        super().__init__(
            f"queue '{queue}' is a stream queue. Option 'queue' reads classic and quorum queues; on a stream it would start "
            f"at the stream's end and skip every message already in it. Read it with option 'stream' (stream mode: "
            "Kafka-style offsets, startingOffsets). Nothing was read or acknowledged"
        )
        self.queue = queue


class DecodeError(AmqpProtocolError):
    """A frame whose payload does not decode as what it claims to be."""


class UnknownMethod(DecodeError):
    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(f"unknown method {class_id}.{method_id}")
        self.class_id = class_id
        self.method_id = method_id


class AmqpReplyError(AmqpProtocolError):
    """A channel or connection closed with a reply code (by the broker; or, in the embedded broker, to the client).

    ``soft`` codes close only the channel unless the close came on the
    connection (a refused login is a 403 connection close). ``class_id`` and
    ``method_id`` name the method that caused it (0 when none did).
    """

    code: ClassVar[int] = 0
    reply: ClassVar[str] = "ERROR"
    soft: ClassVar[bool] = False

    def __init__(self, text: str, class_id: int = 0, method_id: int = 0, *, on_connection: bool | None = None) -> None:
        prefix = f"{self.reply} - "
        self.text = text if text.startswith(prefix) else prefix + text
        self.class_id = class_id
        self.method_id = method_id
        self.closes_connection = (not self.soft) if on_connection is None else on_connection
        super().__init__(self.text)

    @property
    def method(self) -> str:
        """The AMQP method the broker refused, e.g. ``queue.declare``; empty when none."""
        return method_name(self.class_id, self.method_id)

    def __str__(self) -> str:
        caused = f" (on {self.method})" if self.method else ""
        return f"{self.code} {self.text}{caused}"


class ContentTooLarge(AmqpReplyError):
    code, reply, soft = 311, "CONTENT_TOO_LARGE", True


class NoRoute(AmqpReplyError):
    code, reply, soft = 312, "NO_ROUTE", True


class NoConsumers(AmqpReplyError):
    code, reply, soft = 313, "NO_CONSUMERS", True


class ConnectionForced(AmqpReplyError):
    code, reply, soft = 320, "CONNECTION_FORCED", False
    retryable = True


class InvalidPath(AmqpReplyError):
    code, reply, soft = 402, "INVALID_PATH", False


class AccessRefused(AmqpReplyError):
    code, reply, soft = 403, "ACCESS_REFUSED", True


class NotFound(AmqpReplyError):
    code, reply, soft = 404, "NOT_FOUND", True


class ResourceLocked(AmqpReplyError):
    code, reply, soft = 405, "RESOURCE_LOCKED", True


# RabbitMQ's words (rabbit_stream_queue) for a stream with no running member on the connection's node;
# no code tells it apart from a permanent 406.
NO_LOCAL_REPLICA = "does not have a running replica on the local node"


class PreconditionFailed(AmqpReplyError):
    code, reply, soft = 406, "PRECONDITION_FAILED", True

    @property
    def no_local_replica(self) -> bool:
        """The stream has no running member on the node this connection is on: after a leader failover
        its replica there restarts (seconds); RabbitMQ says so to basic.consume and queue.declare."""
        return NO_LOCAL_REPLICA in self.text

    @property
    def transient(self) -> bool:
        # Caused by no method: RabbitMQ's consumer_timeout closing a consumer's
        # channel. Reopening it is right: the deliveries were requeued. No local
        # replica: it runs again in seconds, and a reconnect may reach another node.
        return self.class_id == 0 or self.no_local_replica


class FrameError(AmqpReplyError):
    code, reply, soft = 501, "FRAME_ERROR", False


class SyntaxError_(AmqpReplyError):
    code, reply, soft = 502, "SYNTAX_ERROR", False


class CommandInvalid(AmqpReplyError):
    code, reply, soft = 503, "COMMAND_INVALID", False


class ChannelError(AmqpReplyError):
    code, reply, soft = 504, "CHANNEL_ERROR", False


class UnexpectedFrame(AmqpReplyError):
    code, reply, soft = 505, "UNEXPECTED_FRAME", False


class ResourceError(AmqpReplyError):
    code, reply, soft = 506, "RESOURCE_ERROR", False
    retryable = True


class NotAllowed(AmqpReplyError):
    code, reply, soft = 530, "NOT_ALLOWED", False


class NotImplemented_(AmqpReplyError):
    code, reply, soft = 540, "NOT_IMPLEMENTED", False


class InternalError(AmqpReplyError):
    code, reply, soft = 541, "INTERNAL_ERROR", False
    retryable = True

    @property
    def deprecated_feature(self) -> str | None:
        """The deprecated feature the broker denies, when that is what this 541 says (RabbitMQ 4.x, e.g.
        ``transient_nonexcl_queues``): the one case where only the reply text tells a permanent 541 apart."""
        match = re.search(r"Feature `([A-Za-z0-9_]+)` is deprecated", self.text)
        return match.group(1) if match else None

    @property
    def transient(self) -> bool:
        return self.deprecated_feature is None


class StreamResponseError(AmqpProtocolError):
    """A stream-protocol request the broker answered with a response code other than OK.

    The stream protocol's codes (its PROTOCOL.adoc) are its own, not AMQP reply codes;
    ``STREAM_CODES`` names each and says which are worth a retry.
    """

    def __init__(self, code: int, about: str) -> None:
        name, self._retry = STREAM_CODES.get(code, (f"response code {code:#04x}", False))
        super().__init__(f"{about}: {name} ({code:#04x})")
        self.code = code
        self.name = name

    @property
    def transient(self) -> bool:
        return self._retry


# The stream protocol's response codes: (name, whether retrying may work). A stream that is
# "not available" has no leader for now (an election, a restart); the rest stay as they are.
STREAM_CODES: MappingProxyType[int, tuple[str, bool]] = MappingProxyType(
    {
        0x02: ("stream does not exist", False),
        0x03: ("subscription id already exists", False),
        0x04: ("subscription id does not exist", False),
        0x05: ("stream already exists", False),
        0x06: ("stream not available", True),
        0x07: ("SASL mechanism not supported", False),
        0x08: ("authentication failure", False),
        0x09: ("SASL error", False),
        0x0A: ("SASL challenge", False),
        0x0B: ("SASL authentication failure loopback", False),
        0x0C: ("virtual host access failure", False),
        0x0D: ("unknown frame", False),
        0x0E: ("frame too large", False),
        0x0F: ("internal error", True),
        0x10: ("access refused", False),
        0x11: ("precondition failed", False),
        0x12: ("publisher does not exist", False),
        0x13: ("no offset", False),
        0x14: ("SASL cannot change mechanism", False),
        0x15: ("SASL cannot change username", False),
    }
)


REPLY_CODES: MappingProxyType[int, type[AmqpReplyError]] = MappingProxyType(
    {
        cls.code: cls
        for cls in (
            ContentTooLarge,
            NoRoute,
            NoConsumers,
            ConnectionForced,
            InvalidPath,
            AccessRefused,
            NotFound,
            ResourceLocked,
            PreconditionFailed,
            FrameError,
            SyntaxError_,
            CommandInvalid,
            ChannelError,
            UnexpectedFrame,
            ResourceError,
            NotAllowed,
            NotImplemented_,
            InternalError,
        )
    }
)


def reply_error(code: int, text: str, class_id: int = 0, method_id: int = 0, *, on_connection: bool | None = None) -> AmqpReplyError:
    """The exception for a close with ``code``; an unknown code gets a plain ``AmqpReplyError`` carrying it."""
    cls = REPLY_CODES.get(code)
    if cls is None:
        cls = type(f"Reply{code}", (AmqpReplyError,), {"code": code, "reply": f"REPLY_{code}", "soft": False})
    return cls(text, class_id, method_id, on_connection=on_connection)


def reply_name(code: int) -> str:
    cls = REPLY_CODES.get(code)
    return cls.reply if cls is not None else f"REPLY_{code}"


_CLASS_NAMES = {10: "connection", 20: "channel", 40: "exchange", 50: "queue", 60: "basic", 85: "confirm", 90: "tx"}


def method_name(class_id: int, method_id: int) -> str:
    if not class_id:
        return ""
    from pamqp import commands  # pamqp's table of method names, looked up only to describe an error

    cls: Any = commands.INDEX_MAPPING.get((class_id << 16) | method_id)
    return str(cls.name) if cls is not None else f"{_CLASS_NAMES.get(class_id, class_id)}.{method_id}"


def is_transient(err: BaseException) -> bool:
    """Whether retrying (reconnecting, reopening the channel) may succeed: the one place this is decided."""
    if isinstance(err, AmqpProtocolError):
        return err.transient
    if isinstance(err, ssl.SSLError):  # wrong port, untrusted certificate: the same every time
        return False
    if isinstance(err, ConnectionRefusedError | ConnectionResetError | ConnectionAbortedError | TimeoutError | BrokenPipeError):
        return True
    # Other OS errors: unreachable network, DNS failure while the resolver is down; worth a retry with backoff.
    return isinstance(err, OSError)


def explain(err: BaseException, where: str, user: str, vhost: str, subject: str = "") -> str:
    """``explain.explain``, importable from here too (explain.py builds on the classes above)."""
    from .explain import explain as explained

    return explained(err, where, user, vhost, subject)
