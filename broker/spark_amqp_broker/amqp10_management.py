"""RabbitMQ 4.x's management node (HTTP over AMQP 1.0) on the ``/management`` link pair.

A request is a message whose ``subject`` is the method, ``to`` the path, ``message-id`` what the answer's
``correlation-id`` repeats, and an amqp-value body; the answer's ``subject`` is the status code, its application
property ``http:response`` is ``1.1`` and its amqp-value body the result, or the reason for a refusal (RabbitMQ's
own words). Served: ``GET``/``PUT``/``DELETE /queues/<q>``, ``DELETE /queues/<q>/messages`` (purge),
``PUT``/``DELETE /exchanges/<e>``, ``POST /bindings``. ``PUT /auth/tokens`` is 401: the embedded broker has no
OAuth 2 (a token is not a credential it can check).
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from spark_amqp import errors
from spark_amqp.amqp10 import sections

from .amqp10_frames import description
from .amqp10_links import OutgoingLink
from .stream_typed import encode

if TYPE_CHECKING:
    from .amqp10_session import Session
    from .queue import Queue

__all__ = ["answer"]


class _Refused(Exception):
    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def _status(err: errors.AmqpReplyError, default: str = "400") -> str:
    if isinstance(err, errors.NotFound):
        return "404"
    if isinstance(err, errors.AccessRefused):
        return "403"
    return default  # another connection's exclusive queue too: RabbitMQ's node answers any other refusal 400


def answer(session: Session, link_name: str, raw: bytes) -> None:
    request = sections(raw)
    message_id = request.property("message_id")
    try:
        status, body = _handle(session, str(request.property("subject")), str(request.property("to")), request.value)
    except _Refused as refused:
        status, body = refused.status, refused.text
    except errors.AmqpReplyError as err:
        status, body = _status(err), description(err)
    properties = [("null", None), ("null", None), ("null", None), ("utf8", status), ("null", None), _typed(message_id)]
    reply = (
        b"\x00\x53\x73"
        + encode(("list", properties))
        + b"\x00\x53\x74"
        + encode(("map", [(("utf8", "http:response"), ("utf8", "1.1"))]))
        + b"\x00\x53\x77"
        + encode(_typed(body))
    )
    pair = next(
        (lk for lk in session.links.values() if isinstance(lk, OutgoingLink) and lk.name == link_name and lk.replies is not None), None
    )
    if pair is not None:
        pair.reply(reply)


def _handle(session: Session, method: str, path: str, body: Any) -> tuple[str, Any]:
    vhost = session.connection.server.vhost
    owner = session.connection
    parts = [urllib.parse.unquote(p) for p in path.split("?")[0].split("/")[1:]]
    if parts[:1] == ["queues"] and len(parts) == 2:
        name = parts[1]
        if method == "GET":
            queue = vhost.queues.get(name)
            if queue is None:
                raise _Refused("404", f"queue '{name}' in vhost '/' not found")
            return "200", _queue(queue)
        if method == "PUT":
            spec = body if isinstance(body, dict) else {}
            existed = name in vhost.queues
            try:
                queue = vhost.declare_queue(
                    name,
                    False,
                    bool(spec.get("durable", True)),
                    bool(spec.get("exclusive", False)),
                    bool(spec.get("auto_delete", False)),
                    dict(spec.get("arguments") or {}),
                    owner,
                )
            except errors.PreconditionFailed as err:
                raise _Refused("409", description(err)) from None
            return ("200" if existed else "201"), _queue(queue)
        if method == "DELETE":
            return "200", {"message_count": vhost.delete_queue(name, False, False, owner)}
    if parts[:1] == ["queues"] and len(parts) == 3 and parts[2] == "messages" and method == "DELETE":
        return "200", {"message_count": vhost.queue(parts[1], owner).purge()}
    if parts[:1] == ["exchanges"] and len(parts) == 2:
        if method == "PUT":
            spec = body if isinstance(body, dict) else {}
            try:
                vhost.declare_exchange(
                    parts[1],
                    str(spec.get("type", "direct")),
                    False,
                    bool(spec.get("durable", True)),
                    bool(spec.get("auto_delete", False)),
                    bool(spec.get("internal", False)),
                    dict(spec.get("arguments") or {}),
                )
            except errors.PreconditionFailed as err:
                raise _Refused("400" if "unknown exchange type" in err.text else "409", description(err)) from None
            return "204", None
        if method == "DELETE":
            vhost.delete_exchange(parts[1], False)
            return "204", None
    if parts == ["bindings"] and method == "POST":
        spec = body if isinstance(body, dict) else {}
        source, key, arguments = str(spec.get("source", "")), str(spec.get("binding_key", "")), dict(spec.get("arguments") or {})
        if "destination_queue" in spec:
            vhost.bind(str(spec["destination_queue"]), source, key, arguments, owner)
        else:
            vhost.bind_exchange(str(spec.get("destination_exchange", "")), source, key, arguments)
        return "204", None
    if parts == ["auth", "tokens"] and method == "PUT":
        raise _Refused("401", "the embedded broker does not take OAuth 2 tokens")
    raise _Refused("400", f"cannot {method} {path}")


def _queue(queue: Queue) -> dict[str, Any]:
    kind = "stream" if queue.is_stream else queue.args.kind
    arguments = {k: v.decode() if isinstance(v, bytes) else v for k, v in queue.arguments.items()}
    return {
        "message_count": queue.message_count,
        "consumer_count": len(queue.consumers),
        "name": queue.name,
        "vhost": "/",
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "type": kind,
        "arguments": arguments,
        "leader": "rabbit@localhost",
        "replicas": ["rabbit@localhost"],
    }


def _typed(value: Any) -> tuple[str, Any]:
    """A Python value as a typed one for ``stream_typed.encode`` (RabbitMQ's types for the node's answers)."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("long", value) if value < 0 else ("ulong", value)
    if isinstance(value, str):
        return ("utf8", value)
    if isinstance(value, bytes):
        return ("binary", value)
    if isinstance(value, dict):
        return ("map", [(_typed(str(k)), _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return ("utf8", str(value))
