"""RabbitMQ's management node over AMQP 1.0 (HTTP over AMQP, RabbitMQ 4.x): requests on a pair of links to
``/management`` that share one name and carry ``paired: true``, each request a message with a method as its
``subject``, a path as its ``to`` and ``$me`` as its ``reply-to``; the answer's ``subject`` is an HTTP status code.

The connector's requests: ``PUT /auth/tokens`` (a running connection's renewed OAuth 2 token), and for the queue
source and the sink ``PUT /queues/<q>``, ``PUT /exchanges/<e>`` and ``POST /bindings`` (declareQueue,
declareExchange) and ``GET /queues/<q>`` (its type and its consumers). An answer other than success is the exception its status stands for (``STATUS``).
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
from typing import TYPE_CHECKING, Any

from .. import amqp10
from ..amqp10.types import Symbol
from ..errors import AccessRefused, AmqpReplyError, ConnectionLost, NotFound, PreconditionFailed

if TYPE_CHECKING:
    from .connection import Amqp10Client
    from .links import Receiver, Sender

__all__ = ["STATUS", "Management", "bind", "declare_exchange", "declare_queue", "queue_info"]

NODE = "/management"
# A refusal's status: the exception an AMQP 0-9-1 reply code of the same meaning is.
STATUS: dict[int, type[AmqpReplyError]] = {400: PreconditionFailed, 403: AccessRefused, 404: NotFound, 409: PreconditionFailed}
LINK_NAME = "management-link-pair"


class Management:
    """The link pair, attached on first use; one request at a time (the connector makes one every token renewal)."""

    def __init__(self, client: Amqp10Client) -> None:
        self.client = client
        self._sender: Sender | None = None
        self._receiver: Receiver | None = None
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def request(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status code, body) of the node's answer to ``method`` ``path`` with ``body`` (an amqp-value)."""
        async with self._lock:
            sender = await self._links()
            deadline = self.client.loop.time() + self.client.options.connection_timeout
            while sender.credit <= 0:  # RabbitMQ gives the node's sender credit once attached
                sender.credit_changed.clear()
                left = deadline - self.client.loop.time()
                if left <= 0:
                    raise ConnectionLost(f"RabbitMQ's management node gave no credit for {method} {path} within connectionTimeout")
                try:
                    await asyncio.wait_for(sender.credit_changed.wait(), left)
                except TimeoutError:
                    continue
            message_id = f"spark-amqp-{next(self._ids)}"
            properties: list[Any] = [message_id, None, path, method, "$me"]
            sender.send(amqp10.encode_value_message(body, properties))
            try:
                reply = await asyncio.wait_for(self._replies.get(), self.client.options.connection_timeout)
            except TimeoutError:
                raise ConnectionLost(f"no answer from RabbitMQ's management node to {method} {path} within connectionTimeout") from None
            parts = amqp10.sections(reply)
            status = parts.property("subject")
            return int(status) if status is not None and str(status).isdigit() else 0, parts.value

    async def _links(self) -> Sender:
        if self._sender is None or self._receiver is None or self._sender.closed.done() or self._receiver.closed.done():
            paired = {Symbol("paired"): True}
            self._sender = await self.client.sender(NODE, lambda *outcome: None, name=LINK_NAME, settled=True, properties=paired)
            self._receiver = await self.client.receiver(
                NODE, lambda delivery_id, message: self._replies.put_nowait(message), name=LINK_NAME, settled=True, properties=paired
            )
            self._receiver.grant(16)
        if self._receiver.credit < 8:
            self._receiver.grant(16)
        return self._sender


def _path(queue: str) -> str:
    return f"/queues/{urllib.parse.quote(queue, safe='')}"


async def _ok(client: Amqp10Client, method: str, path: str, body: Any, what: str) -> Any:
    status, answer = await client.management_request(method, path, body)
    if 200 <= status < 300:
        return answer
    # The node's own words (they name the queue or exchange); the status only where it gives none.
    raise STATUS.get(status, PreconditionFailed)(str(answer) if answer else f"{what}: status {status}", on_connection=False)


async def declare_queue(client: Amqp10Client, queue: str, durable: bool, arguments: dict[str, Any]) -> None:
    await _ok(
        client,
        "PUT",
        _path(queue),
        {"durable": durable, "auto_delete": False, "exclusive": False, "arguments": arguments},
        f"declaring queue '{queue}'",
    )


async def declare_exchange(client: Amqp10Client, exchange: str, kind: str, durable: bool) -> None:
    body = {"type": kind, "durable": durable, "auto_delete": False, "internal": False, "arguments": {}}
    await _ok(client, "PUT", f"/exchanges/{urllib.parse.quote(exchange, safe='')}", body, f"declaring exchange '{exchange}'")


async def bind(client: Amqp10Client, exchange: str, queue: str, key: str) -> None:
    body = {"source": exchange, "destination_queue": queue, "binding_key": key, "arguments": {}}
    await _ok(client, "POST", "/bindings", body, f"binding queue '{queue}' to exchange '{exchange}'")


async def queue_info(client: Amqp10Client, queue: str) -> dict[str, Any]:
    """The queue as the node shows it: ``type``, ``message_count``, ``consumer_count``, ``arguments``…"""
    answer = await _ok(client, "GET", _path(queue), None, f"queue '{queue}'")
    return dict(answer) if isinstance(answer, dict) else {}
