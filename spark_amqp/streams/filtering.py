"""Stream filtering (RabbitMQ 3.13+): which chunks the broker sends, and which rows the source keeps.

A publisher marks a message with the header ``x-stream-filter-value``; the
broker keeps a Bloom filter of those values per chunk and sends a consumer with
``x-stream-filter`` only the chunks that may hold one of its values (with
``x-stream-match-unfiltered``, also those holding a message without a value).
Measured on RabbitMQ 4.0.5 and 4.3.6 over AMQP 0-9-1: a chunk that matches
comes whole, other values included; and a Bloom filter may let a chunk through
that matches nothing (not seen with the values tested). So the broker only saves work; each row is checked here
too, which makes the result exact. RabbitMQ 3.10 ignores the arguments and
sends everything, which is why ``filter`` is refused below 3.13 (the rows would
still be right, but a user asking for broker-side filtering would not get it).
"""

from __future__ import annotations

from typing import Any

from ..client.properties import LazyProperties
from ..errors import AmqpSourceError
from ..rabbitmq import FILTER_VALUE_HEADER
from .options import StreamSourceOptions

__all__ = ["MIN_VERSION", "RowFilter", "consumer_arguments", "require"]

MIN_VERSION = (3, 13)


def consumer_arguments(options: StreamSourceOptions) -> dict[str, Any]:
    """The basic.consume arguments that ask the broker to skip chunks (none without a filter)."""
    if not options.filter:
        return {}
    values: Any = options.filter[0] if len(options.filter) == 1 else list(options.filter)
    arguments: dict[str, Any] = {"x-stream-filter": values}
    if options.match_unfiltered:
        arguments["x-stream-match-unfiltered"] = True
    return arguments


async def require(client: Any, options: StreamSourceOptions) -> None:
    """Refuse option ``filter`` on a broker that cannot serve it (``client``: either protocol's client). One that does not say its version (not
    RabbitMQ) is given the benefit of the doubt: the rows are checked here anyway. (Async, to run where
    the other questions to the broker run.)"""
    version = client.server_version
    if not options.filter or version is None or version >= MIN_VERSION:
        return
    raise AmqpSourceError(
        f"option 'filter' needs RabbitMQ {MIN_VERSION[0]}.{MIN_VERSION[1]} or later (stream filtering), but the broker at "
        f"{options.connection.display_uri} is {version[0]}.{version[1]}, which would send every message: upgrade the "
        "broker, or leave 'filter' out and filter the rows in Spark (df.where(...))"
    )


class RowFilter:
    """Whether a delivered message is one the filter asks for."""

    __slots__ = ("match_unfiltered", "values")

    def __init__(self, values: tuple[str, ...], match_unfiltered: bool) -> None:
        self.values = frozenset(values)
        self.match_unfiltered = match_unfiltered

    def keeps(self, props: LazyProperties) -> bool:
        value = props.text_header(FILTER_VALUE_HEADER)
        return self.match_unfiltered if value is None else value in self.values
