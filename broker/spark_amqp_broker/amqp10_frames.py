"""What the AMQP 1.0 modules share: a performative's frame, and AMQP 0-9-1's errors (the vhost's) as AMQP 1.0's
conditions and descriptions, as RabbitMQ 4.x words them; and address format v2."""

from __future__ import annotations

import urllib.parse
from typing import Any

from spark_amqp import errors
from spark_amqp.amqp10 import performatives as p
from spark_amqp.amqp10.performatives import Performative as P
from spark_amqp.amqp10.types import Described, Symbol, encode

__all__ = ["condition_of", "description", "error", "parse_address", "performative"]


def performative(channel: int, code: int, fields: list[Any], kind: int = 0) -> bytes:
    while fields and fields[-1] is None:
        fields.pop()
    return p.frame(channel, encode(Described(code, fields)), kind=kind)


def error(condition: str, description: str) -> Described:
    return Described(P.ERROR, [Symbol(condition), description])


def condition_of(err: errors.AmqpReplyError) -> str:
    """The AMQP 1.0 condition RabbitMQ gives for what AMQP 0-9-1 says with ``err``'s reply code."""
    return {
        404: "amqp:not-found",
        403: "amqp:unauthorized-access",
        405: "amqp:resource-locked",
        406: "amqp:precondition-failed",
        320: "amqp:connection:forced",
        530: "amqp:not-allowed",
        540: "amqp:not-implemented",
    }.get(err.code, "amqp:internal-error")


def description(err: errors.AmqpReplyError) -> str:
    """The error's own words, as an AMQP 1.0 error's description says them (without AMQP 0-9-1's reply name)."""
    return err.text.removeprefix(f"{err.reply} - ")


def parse_address(address: Any) -> tuple[str, str, str | None]:
    """(kind, name, routing key) of an address v2: ("queue", q, None), ("exchange", e, key or None)."""
    if not isinstance(address, str):
        raise errors.SyntaxError_("no address")
    parts = address.split("/")
    if len(parts) == 3 and parts[1] == "queues" and parts[2]:
        return "queue", urllib.parse.unquote(parts[2]), None
    if len(parts) in (3, 4) and parts[1] == "exchanges" and parts[2]:
        return "exchange", urllib.parse.unquote(parts[2]), urllib.parse.unquote(parts[3]) if len(parts) == 4 else None
    raise errors.SyntaxError_(f"bad address '{address}'")
