"""Stream queue arguments and consumer start specifications, refused as RabbitMQ refuses them.

Shared by the AMQP 0-9-1 declare (``StreamQueue``) and the stream protocol's ``create``,
which takes the same settings as strings without their ``x-`` prefix.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

from spark_amqp import errors

# Arguments RabbitMQ 3.10 knows for other queue types and refuses on a stream.
KNOWN_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-quorum-initial-group-size",
)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's default segment size
_AGE_UNITS_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
_AGE = re.compile(r"^([0-9]*)(.*)$", re.DOTALL)


def where(name: str) -> str:
    return f"queue '{name}' in vhost '/'"


def internal_error() -> errors.AmqpReplyError:
    # RabbitMQ crashes on an x-stream-offset of a type it does not expect: a bare 541 closes the connection.
    err = errors.InternalError("internal error")
    err.text = "INTERNAL_ERROR"
    return err


def age_ms(value: str) -> int | None:
    """An age such as ``10s``, ``1m`` (minute), ``1M`` (month), ``2D``, ``1Y`` in ms; None if invalid (406).

    RabbitMQ 3.10 and 4.0 crashed (541) on one with no leading digits; 4.3 refuses it with 406."""
    digits, unit = _AGE.match(value).groups()  # type: ignore[union-attr]
    if not digits or unit not in _AGE_UNITS_MS or int(digits) == 0:
        return None
    return int(digits) * _AGE_UNITS_MS[unit]


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, str):
        return "longstr"
    return type(value).__name__


class StreamArguments:
    """A stream's declare arguments and properties, refused as RabbitMQ 3.10 refuses them."""

    def __init__(self, name: str, args: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool) -> None:
        place = where(name)
        self.max_bytes = self._size(place, args, "x-max-length-bytes")
        self.segment_bytes = self._size(place, args, "x-stream-max-segment-size-bytes") or DEFAULT_SEGMENT_BYTES
        self.max_age_ms: int | None = None
        if "x-max-age" in args:
            value = args["x-max-age"]
            if not isinstance(value, str):
                raise errors.PreconditionFailed(f"invalid arg 'x-max-age' for {place}: {{unacceptable_type,{_type_name(value)}}}")
            self.max_age_ms = age_ms(value)
            if self.max_age_ms is None:
                raise errors.PreconditionFailed(f"invalid arg 'x-max-age' for {place}: invalid_max_age")
        if "x-initial-cluster-size" in args and args["x-initial-cluster-size"] == 0:
            raise errors.PreconditionFailed(f"invalid arg 'x-initial-cluster-size' for {place}: {{value_zero,0}}")
        locator = args.get("x-queue-leader-locator")
        if locator is not None and locator not in LEADER_LOCATORS:
            raise errors.PreconditionFailed(f"invalid arg 'x-queue-leader-locator' for {place}: invalid_queue_locator_arg")
        # Observed order: auto-delete, then exclusive, then non-durable.
        for refused, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
            if refused:
                raise errors.PreconditionFailed(f"invalid property '{prop}' for {place}")
        for key in KNOWN_ARGUMENTS:
            if key in args:
                raise errors.PreconditionFailed(f"invalid arg '{key}' for {place} of queue type rabbit_stream_queue")

    @staticmethod
    def _size(where: str, args: dict[str, Any], key: str) -> int | None:
        if key not in args:
            return None
        value = args[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.PreconditionFailed(f"invalid arg '{key}' for {where}: \"expected integer, got {_type_name(value)}\"")
        if value < 0:
            raise errors.PreconditionFailed(f"invalid arg '{key}' for {where}: {{value_negative,{value}}}")
        return value


def start_spec(name: str, value: Any) -> tuple[str, int]:
    """Where a consumer starts, from its ``x-stream-offset``: (kind, value), kind one of
    first / last / next / offset / timestamp (ms)."""
    if value is None:
        return ("next", 0)
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        raise internal_error()
    if isinstance(value, int):
        return ("offset", value)
    if isinstance(value, datetime.datetime):
        return ("timestamp", int(value.timestamp()) * 1000)
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return (value, 0)
        interval = age_ms(value)
        if interval is not None:
            return ("timestamp", int(time.time() * 1000) - interval)
        raise errors.PreconditionFailed(
            f"invalid arg 'x-stream-offset' for {where(name)}: {{invalid_stream_offset_arg,{{longstr,<<\"{value}\">>}}}}"
        )
    raise internal_error()


# The stream protocol's create names these settings without the x- prefix, as strings;
# RabbitMQ types them as the AMQP 0-9-1 declare would and drops any other key.
_CREATE_INTEGERS = {
    "max-length-bytes": "x-max-length-bytes",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
    "initial-cluster-size": "x-initial-cluster-size",
    "stream-filter-size-bytes": "x-stream-filter-size-bytes",
}
_CREATE_STRINGS = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}
MAX_SEGMENT_BYTES = 3_000_000_000  # RabbitMQ's ceiling for x-stream-max-segment-size-bytes


def create_arguments(given: dict[str, str]) -> dict[str, Any] | None:
    """The declare arguments of a stream-protocol ``create``; None for what RabbitMQ 4.3 refuses
    there (precondition failed): a cluster size below 1, an unknown leader locator, a segment
    size above 3 GB, a filter size outside 16..255, a number that is not one."""
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in given.items():
        if key in _CREATE_INTEGERS:
            try:
                out[_CREATE_INTEGERS[key]] = int(value)
            except ValueError:
                return None
        elif key in _CREATE_STRINGS:
            out[_CREATE_STRINGS[key]] = value
    if out.get("x-initial-cluster-size", 1) <= 0 or out.get("x-queue-leader-locator", "balanced") not in LEADER_LOCATORS:
        return None
    if out.get("x-stream-max-segment-size-bytes", 0) > MAX_SEGMENT_BYTES or not 16 <= out.get("x-stream-filter-size-bytes", 16) <= 255:
        return None
    return out
