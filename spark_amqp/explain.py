"""What went wrong and how to fix it, in words for the person running the Spark job.

``explain`` turns any exception of ``errors.py`` (or an OS error) into one sentence that names the
broker (its display uri: never a password), what was being done, and the option or permission to
change. Importable from ``spark_amqp.errors`` too.
"""

from __future__ import annotations

from .errors import (
    AccessRefused,
    AmqpProtocolError,
    AmqpReplyError,
    ConnectionForced,
    InternalError,
    LoginRefused,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    StreamResponseError,
    TokenError,
)

__all__ = ["DEPRECATED_FIXES", "explain"]

# RabbitMQ 4.3's words when it closes a connection whose login (an OAuth 2 token) has expired.
CREDENTIAL_EXPIRED = "credential expired"


# What to do instead of a deprecated feature RabbitMQ 4.x can deny (deprecated_features.permit.<name> = false).
DEPRECATED_FIXES = {
    "transient_nonexcl_queues": "declare the queue durable (queueDurable=true, the default) or let an application declare it",
    "global_qos": "use per-consumer prefetch (the connector always does)",
}


def explain(err: BaseException, where: str, user: str, vhost: str, subject: str = "") -> str:
    """What went wrong and how to fix it, for the person running the job.

    ``where`` is the broker's display uri (never a password), ``subject`` what
    the call was about (``queue 'orders'``, ``exchange 'events'``).
    """
    about = f"{subject} on {where}" if subject else where
    if isinstance(err, LoginRefused | TokenError):
        return f"{about}: {err}"  # whole already: what was tried, and the option to change
    if isinstance(err, ConnectionForced) and CREDENTIAL_EXPIRED in err.text:
        return (
            f"{about}: the broker closed the connection because its OAuth 2 token expired ({err}). Give "
            "oauth2.tokenEndpoint or oauth2.tokenProvider so that every connection renews its token before it expires; "
            "a token given as option 'password' cannot be renewed"
        )
    if isinstance(err, AccessRefused):
        if err.closes_connection:
            return f"the broker refused the login of user '{user}' on {where} ({err}); check the uri's user and the 'password' option"
        return (
            f"{about}: user '{user}' is not allowed to do this ({err}); grant the user configure/write/read permissions on vhost '{vhost}'"
        )
    if isinstance(err, NotAllowed):
        return f"{where}: vhost '{vhost}' does not exist or user '{user}' may not use it ({err}); check the vhost at the end of the uri ('%2F' for '/')"
    if isinstance(err, StreamResponseError):
        return _explain_stream_code(err, about, where, user, vhost)
    if isinstance(err, NotFound):
        if subject.startswith("stream"):
            return f"{about}: not found ({err}); declare it first as a stream queue (x-queue-type=stream)"
        return f"{about}: not found ({err}); create it first, or let the connector declare it (declareQueue / declareExchange)"
    if isinstance(err, PreconditionFailed) and err.no_local_replica:
        return (
            f"{about}: the node this connection reached has no running replica of the stream ({err}): a leader failover "
            "restarts it for a few seconds, or the stream has no member on that node; reconnecting tries another node"
        )
    if isinstance(err, PreconditionFailed) and err.method == "Queue.Declare":
        return f"{about}: the queue exists with other properties than those asked for ({err}); make queueDurable/queueArguments match the queue, or leave declareQueue off"
    if isinstance(err, ResourceLocked):
        return f"{about}: locked by another connection ({err}): an exclusive queue, or a queue with an exclusive consumer"
    if isinstance(err, InternalError) and err.deprecated_feature:
        return (
            f"{about}: the broker denies the deprecated feature '{err.deprecated_feature}' ({err.code} {err.reply}); "
            f"{DEPRECATED_FIXES.get(err.deprecated_feature, 'stop using it, or ask the operator to permit it')}"
        )
    if isinstance(err, AmqpReplyError):
        return f"{about}: the broker refused it ({err})"
    if isinstance(err, AmqpProtocolError):
        return f"{about}: {err}"
    return f"{about}: {type(err).__name__}: {err}"


def _explain_stream_code(err: StreamResponseError, about: str, where: str, user: str, vhost: str) -> str:
    """``explain`` for a stream-protocol response code: the same advice as for the AMQP 0-9-1 reply it matches."""
    if err.code == 0x02:
        return (
            f"{about}: not found ({err}); declare it first as a stream queue (x-queue-type=stream). The stream protocol "
            "sees streams only: a classic or quorum queue is read with option 'queue' and an amqp:// uri"
        )
    if err.code in (0x08, 0x0B):
        return f"the broker refused the login of user '{user}' on {where} ({err}); check the uri's user and the 'password' option"
    if err.code == 0x0C:
        return f"{where}: vhost '{vhost}' does not exist or user '{user}' may not use it ({err}); check the vhost at the end of the uri ('%2F' for '/')"
    if err.code == 0x10:
        return (
            f"{about}: user '{user}' is not allowed to do this ({err}); grant the user configure/write/read permissions on vhost '{vhost}'"
        )
    return f"{about}: the broker refused it ({err})"
