"""Server-side filter expressions over AMQP 1.0 (stream mode, ``protocol=amqp1.0``): RabbitMQ 4.1+ compares each
message's properties and application properties with the values given (``filterProperties``,
``filterApplicationProperties``), RabbitMQ 4.2+ evaluates an SQL expression (``filterSql``), and only messages that
match are sent. Unlike the Bloom filter (option ``filter``), the broker's answer is exact: no row is checked here.

RabbitMQ answers an attach with the filters it took and leaves out, without an error, one it cannot parse or does not
have (4.0 has neither kind; SQL came with 4.2; SQL and property filters exclude each other), so what it left out is
refused here, by option name, rather than read unfiltered.

The offsets of messages that do not match never arrive, so a range's end is found by draining the link: RabbitMQ
answers a drain only once it has read up to the stream's end (it holds the answer while it is still going through
messages that do not match), and the range's end was in the stream when it was planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..amqp10.types import Described, Symbol, Timestamp, UInt
from ..amqp10_client import Amqp10Client
from ..errors import AmqpOptionError, AmqpSourceError, NotFound
from ..option_reader import OptionReader
from ..transport.options import ConnectionOptions

__all__ = ["NO_EXPRESSION", "PROPERTY_NAMES", "ExpressionFilter", "parse", "refused", "require"]

# The properties section's fields (AMQP 1.0 part 3.2.4), by the names the properties filter takes.
PROPERTY_NAMES = (
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
)
_TIMES = ("absolute-expiry-time", "creation-time")
_PROPERTIES = Symbol("amqp:properties-filter")
_APPLICATION = Symbol("amqp:application-properties-filter")
_SQL_KEY, _SQL = Symbol("sql-filter"), Symbol("amqp:sql-filter")
_OFFSET_SPEC = Symbol("rabbitmq:stream-offset-spec")
_SINCE = {_PROPERTIES: (4, 1), _APPLICATION: (4, 1), _SQL_KEY: (4, 2)}
_OPTION_OF = {_PROPERTIES: "filterProperties", _APPLICATION: "filterApplicationProperties", _SQL_KEY: "filterSql"}


@dataclass(frozen=True)
class ExpressionFilter:
    """The values the options give, checked (tuples of pairs keep the options hashable, as a frozen dataclass is)."""

    properties: tuple[tuple[str, Any], ...] = ()
    application_properties: tuple[tuple[str, Any], ...] = ()
    sql: str | None = None

    def __bool__(self) -> bool:
        return bool(self.properties or self.application_properties or self.sql)

    def source_filters(self) -> dict[Symbol, Described]:
        """The entries of a receiver's source filter set that ask for these expressions."""
        filters: dict[Symbol, Described] = {}
        if self.properties:
            filters[_PROPERTIES] = Described(_PROPERTIES, {Symbol(k): _property_value(k, v) for k, v in self.properties})
        if self.application_properties:
            filters[_APPLICATION] = Described(_APPLICATION, dict(self.application_properties))
        if self.sql:
            filters[_SQL_KEY] = Described(_SQL, self.sql)
        return filters


NO_EXPRESSION = ExpressionFilter()


def _property_value(name: str, value: Any) -> Any:
    if name in _TIMES:
        return Timestamp(value)  # milliseconds since the epoch, as the property holds it
    if name == "group-sequence":
        return UInt(value)
    return value


def parse(r: OptionReader, connection: ConnectionOptions) -> ExpressionFilter:
    properties = r.json_object("filterProperties")
    application = r.json_object("filterApplicationProperties")
    raw_sql = r.text("filterSql")
    sql = None if raw_sql is None else raw_sql.strip()
    given = [k for k, v in (("filterProperties", properties), ("filterApplicationProperties", application), ("filterSql", sql)) if v]
    if not given:
        if sql is not None:
            raise AmqpOptionError("option 'filterSql' is empty: give an SQL expression (RabbitMQ 4.2+), or leave the option out")
        return NO_EXPRESSION
    if not connection.amqp10:
        raise AmqpOptionError(
            f"option '{given[0]}' is a filter RabbitMQ evaluates for AMQP 1.0 consumers only: set option 'protocol' to "
            "'amqp1.0' (RabbitMQ 4.1+), or use option 'filter' (the Bloom filter, over every protocol)"
        )
    if sql and (properties or application):
        raise AmqpOptionError(
            f"option 'filterSql' excludes option '{given[0]}': RabbitMQ takes either an SQL filter or property filters on one "
            "link. Say the same in SQL (p.subject = 'x' AND color = 'red')"
        )
    for name, value in properties.items():
        if name not in PROPERTY_NAMES:
            raise AmqpOptionError(
                f"option 'filterProperties': {name!r} is not an AMQP 1.0 property; the properties are {', '.join(PROPERTY_NAMES)}"
            )
        numeric = name in _TIMES or name == "group-sequence"
        if (
            isinstance(value, bool)
            or not isinstance(value, int if numeric else (str, int))
            or (isinstance(value, int) and numeric and value < 0)
        ):
            wanted = "a non-negative integer (milliseconds since the epoch)" if name in _TIMES else "a non-negative integer"
            raise AmqpOptionError(
                f"option 'filterProperties': the value of {name!r} must be {wanted if numeric else 'a string or an integer'}, got "
                f"{json.dumps(value)}"
            )
    for name, value in application.items():
        if value is not None and not isinstance(value, str | int | float | bool):
            raise AmqpOptionError(
                f"option 'filterApplicationProperties': the value of {name!r} must be a string, a number, true or false, got {json.dumps(value)}"
            )
    return ExpressionFilter(tuple(properties.items()), tuple(application.items()), sql or None)


def refused(
    asked: ExpressionFilter, attach: list[Any], connection: ConnectionOptions, version: tuple[int, ...] | None
) -> AmqpSourceError | None:
    """The error for what the broker left out of its attach's source filter set (``attach``: its fields), if anything."""
    source = attach[5] if len(attach) > 5 else None
    fields = getattr(source, "value", None) or []
    taken = fields[7] if len(fields) > 7 and isinstance(fields[7], dict) else {}
    # RabbitMQ 4.0 answers with every filter asked for, taken or not: its version says.
    missing = [_OPTION_OF[key] for key in asked.source_filters() if key not in taken or (version and version < _SINCE[key])]
    if not missing:
        return None
    shown = ".".join(str(v) for v in version[:3]) if version else "a broker that does not say its version"
    return AmqpSourceError(
        f"the broker at {connection.display_uri} (RabbitMQ {shown}) did not take option '{missing[0]}': property filters need "
        "RabbitMQ 4.1 or later, SQL filters 4.2 or later, and RabbitMQ leaves out, without a word, an expression it cannot "
        "parse (check the SQL, and each value's type). Without it every message would come: leave the option out and "
        "filter the rows in Spark (df.where(...)), or upgrade the broker"
    )


async def require(expression: ExpressionFilter, connection: ConnectionOptions, stream: str) -> None:
    """Refuses, before any batch is planned, a filter the broker does not take: a link attached to ``stream`` with the
    filters, at its end and without credit, then detached. A missing stream is left to the planner to say."""
    if not expression:
        return
    client = await Amqp10Client.connect(connection, "spark-amqp filter check")
    try:
        filters: dict[Any, Any] = {_OFFSET_SPEC: Described(_OFFSET_SPEC, Symbol("next")), **expression.source_filters()}
        try:
            receiver = await client.receiver(client.queue_address(stream), lambda delivery_id, message: None, filters)
        except NotFound:
            return
        refusal = refused(expression, receiver.attached.result(), connection, client.server_version)
        await receiver.detach()
        if refusal is not None:
            raise refusal
    finally:
        await client.close()
