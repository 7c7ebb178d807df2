"""Options of the source in stream mode (``stream`` or ``superStream`` instead of ``queue``).

RabbitMQ stream queues are append-only logs with offsets, so this mode needs
neither a journal nor an exclusive consumer: its offsets are stream positions,
and a replayed batch re-reads the same ones. Validation happens here, before
anything connects; connection options are shared with queue mode.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import AmqpOptionError
from ..option_reader import OptionReader, keyed
from ..rabbitmq import MAX_PREFETCH
from ..reading.projection import Projection, projection
from ..reading.trigger import TRIGGER_KEYS, TriggerOptions, parse_trigger
from ..transport.options import CONNECTION_KEYS, ConnectionOptions, parse_connection
from . import expression_filters
from .expression_filters import NO_EXPRESSION, ExpressionFilter

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["STARTS", "At", "End", "Start", "StreamSourceOptions", "is_stream_mode", "parse_stream_options"]

STARTS = ("first", "last", "next")
ENDING_KEYS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
T = TypeVar("T")


@dataclass(frozen=True)
class At:
    """A moment in epoch milliseconds: the position of the first chunk written at or after it."""

    epoch_ms: int


Start = str | int | At  # "first", "last", "next", an offset, or a moment
End = str | int | At  # "latest" (the end when the read is planned), an offset (exclusive), or a moment
DEFAULT_MIN_PARTITION_SIZE = 50_000
DEFAULT_STREAM_PREFETCH = 2_000

STREAM_KEYS = CONNECTION_KEYS | keyed(
    "stream",
    "superStream",
    "superStreamPartitions",
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    *ENDING_KEYS,
    "failOnDataLoss",
    *TRIGGER_KEYS,
    "numPartitions",
    "minPartitionSize",
    "prefetch",
    "filter",
    "filterMatchUnfiltered",
    "filterProperties",
    "filterApplicationProperties",
    "filterSql",
    "streamPort",
)
# Queue-mode options, with why they do not apply to streams.
QUEUE_ONLY = {
    "queue": "options 'queue' and 'stream' exclude each other: 'queue' reads classic or quorum queues, 'stream' reads stream queues",
    "journallocation": "stream mode needs no journal: a replayed batch re-reads the same stream offsets",
    "journalretention": "stream mode needs no journal: a replayed batch re-reads the same stream offsets",
    "dedupeby": "stream mode never sees redeliveries: offsets identify every message",
    "exclusiveconsumer": "stream mode needs no exclusive consumer: several queries can read one stream independently",
    "declarequeue": "stream mode does not declare streams; declare them with x-queue-type=stream",
    "queuedurable": "stream mode does not declare streams",
    "queuearguments": "stream mode does not declare streams",
    "bindexchange": "stream mode does not declare streams",
    "bindingkey": "stream mode does not declare streams",
}


@dataclass(frozen=True)
class StreamSourceOptions:
    connection: ConnectionOptions
    streams: tuple[str, ...]
    # where a new query (or a batch read) starts, per stream
    starting: tuple[tuple[str, Start], ...]
    # where a batch read (spark.read) ends, per stream: "latest" when not given; a streaming query refuses it
    ending: tuple[tuple[str, End], ...]
    fail_on_data_loss: bool
    trigger: TriggerOptions
    num_partitions: int | None
    min_partition_size: int
    prefetch: int
    # superStream without superStreamPartitions: its partitions '<name>-0', '<name>-1', ... are found by name
    # when planning (``streams`` is empty), so only forms that apply to every stream are accepted
    discover: str | None = None
    starting_all: Start = "first"
    ending_all: End | None = None
    # stream filtering (RabbitMQ 3.13+): the values a row's x-stream-filter-value must have, and whether rows
    # without one are kept too; empty: no filter
    filter: tuple[str, ...] = ()
    match_unfiltered: bool = False
    # filter expressions RabbitMQ evaluates for AMQP 1.0 consumers (4.1+: properties, 4.2+: SQL)
    expression: ExpressionFilter = NO_EXPRESSION
    # the columns the query's schema asks for (``.schema(...)``); None: every column
    columns: Projection | None = None

    def start_of(self, stream: str) -> Start:
        return dict(self.starting).get(stream, self.starting_all)

    def end_of(self, stream: str) -> End:
        return dict(self.ending).get(stream, self.ending_all or "latest")

    @property
    def bounded(self) -> bool:
        """Whether an ending option was given (a batch read's; a streaming query refuses them)."""
        return bool(self.ending) or self.ending_all is not None

    @property
    def made(self) -> tuple[str, ...] | None:
        """The columns a range reader makes (None: every column): those asked for, and what the row filter reads."""
        return None if self.columns is None else self.columns.made(bool(self.filter))


def is_stream_mode(options: Mapping[str, str]) -> bool:
    return any(k.lower() in ("stream", "superstream") for k in options)


def parse_stream_options(options: Mapping[str, str], schema: StructType | None = None) -> StreamSourceOptions:
    """The options, checked, and the columns ``schema`` (the reader's, if the query gave one) asks for."""
    for key in options:
        if key.lower() in QUEUE_ONLY:
            raise AmqpOptionError(f"option '{key}' does not apply to streams: {QUEUE_ONLY[key.lower()]}")
    r = OptionReader(options, STREAM_KEYS)
    connection = parse_connection(r, stream_protocol=True)  # rabbitmq-stream://: read over the stream protocol
    stream_port = r.integer("streamPort", None, 1, 65535)
    if stream_port is not None:
        if connection.stream_protocol:
            raise AmqpOptionError(
                "option 'streamPort' is for amqp:// and amqps:// uris (where a read over AMQP 0-9-1 asks the stream protocol "
                "about offsets RabbitMQ did not deliver); a rabbitmq-stream:// uri names its port itself"
            )
        connection = dataclasses.replace(connection, stream_port=stream_port)
    streams, discover = _streams(r)
    starting = _starting(r, streams, discover)
    ending = _ending(r, streams, discover)
    max_messages = r.integer("maxMessagesPerTrigger", None, 1)
    return StreamSourceOptions(
        connection=connection,
        streams=streams,
        starting=starting[0],
        starting_all=starting[1],
        ending=ending[0],
        ending_all=ending[1],
        discover=discover,
        fail_on_data_loss=r.boolean("failOnDataLoss", True),
        trigger=parse_trigger(r, max_messages),
        num_partitions=r.integer("numPartitions", None, 1, 10_000),
        min_partition_size=r.integer("minPartitionSize", DEFAULT_MIN_PARTITION_SIZE, 1) or DEFAULT_MIN_PARTITION_SIZE,
        prefetch=r.integer("prefetch", DEFAULT_STREAM_PREFETCH, 1, MAX_PREFETCH) or DEFAULT_STREAM_PREFETCH,
        filter=_filter(r),
        match_unfiltered=r.boolean("filterMatchUnfiltered", False),
        expression=expression_filters.parse(r, connection),
        columns=projection(schema, "stream"),
    )


def _filter(r: OptionReader) -> tuple[str, ...]:
    raw = r.text("filter")
    if raw is None:
        if r.text("filterMatchUnfiltered") is not None:
            raise AmqpOptionError("option 'filterMatchUnfiltered' only applies with option 'filter'")
        return ()
    values = tuple(v.strip() for v in raw.split(","))
    if not all(values):
        raise AmqpOptionError(f"option 'filter' takes comma-separated filter values, none of them empty; got {raw!r}")
    return tuple(dict.fromkeys(values))


def _streams(r: OptionReader) -> tuple[tuple[str, ...], str | None]:
    plain, sup = r.text("stream"), r.text("superStream")
    if plain is not None and sup is not None:
        raise AmqpOptionError("options 'stream' and 'superStream' exclude each other: give one")
    if sup is not None:
        name = sup.strip()
        if not name:
            raise AmqpOptionError("option 'superStream' is empty: give the super stream's name")
        if len(f"{name}-9999".encode()) > 255:
            raise AmqpOptionError(f"option 'superStream': the name is too long for its partition streams ({name[:40]!r}...)")
        count = r.integer("superStreamPartitions", None, 1, 10_000)
        if count is None:
            return (), name
        streams = tuple(f"{name}-{i}" for i in range(count))
    else:
        if r.text("superStreamPartitions") is not None:
            raise AmqpOptionError("option 'superStreamPartitions' only applies with option 'superStream'")
        streams = r.names("stream", "stream")
    return streams, None


def _one_of(r: OptionReader, keys: tuple[str, str, str]) -> str | None:
    """Which of an offsets option, its timestamp and its per-stream timestamps was given (at most one)."""
    given = [k for k in keys if r.text(k) is not None]
    if len(given) > 1:
        raise AmqpOptionError(f"options {' and '.join(repr(k) for k in given)} exclude each other: give one")
    return given[0] if given else None


def _per_stream(
    r: OptionReader, key: str, streams: tuple[str, ...], value: Callable[[Any], T | None], wanted: str
) -> tuple[tuple[str, T], ...]:
    """A JSON object with an entry for every stream read, each checked by ``value`` (None: refused)."""
    raw = r.text(key) or ""
    try:
        given = json.loads(raw)
    except json.JSONDecodeError:
        given = None
    if not isinstance(given, dict):
        raise AmqpOptionError(f"option '{key}' must be {wanted}, e.g. {{\"{streams[0]}\": 0}}; got {raw!r}")
    unknown = sorted(set(given) - set(streams))
    missing = [s for s in streams if s not in given]
    if unknown:
        raise AmqpOptionError(f"option '{key}' names streams this query does not read: {', '.join(unknown)}")
    if missing:
        raise AmqpOptionError(f"option '{key}' has no entry for: {', '.join(missing)}")
    out: list[tuple[str, T]] = []
    for stream in streams:
        checked = value(given[stream])
        if checked is None:
            raise AmqpOptionError(f"option '{key}': stream '{stream}' has {given[stream]!r}, which is not {wanted}")
        out.append((stream, checked))
    return tuple(out)


def _offset(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _moment(value: Any) -> At | None:
    ms = _offset(value)
    return None if ms is None else At(ms)


def _start(value: Any) -> Start | None:
    if isinstance(value, str) and value.strip().lower() in (*STARTS, "latest"):
        word = value.strip().lower()
        return "next" if word == "latest" else word
    return _offset(value)


def _end(value: Any) -> End | None:
    if isinstance(value, str) and value.strip().lower() == "latest":
        return "latest"
    return _offset(value)


def _not_per_partition(key: str, discover: str | None) -> None:
    if discover is not None:
        raise AmqpOptionError(
            f"option '{key}' names each stream, but the partitions of super stream '{discover}' are only found when the "
            "query runs: give 'superStreamPartitions' as well, or one value for every partition"
        )


def _starting(r: OptionReader, streams: tuple[str, ...], discover: str | None) -> tuple[tuple[tuple[str, Start], ...], Start]:
    """Per-stream starts (JSON forms) and the start of every other stream."""
    key = _one_of(r, ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp"))
    if key == "startingTimestamp":
        return (), At(r.integer(key, None, 0) or 0)
    if key == "startingOffsetsByTimestamp":
        _not_per_partition(key, discover)
        return _per_stream(r, key, streams, _moment, "a JSON object of epoch milliseconds per stream"), "first"
    if key is None:
        return (), "first"
    word = _start(r.text(key))
    if isinstance(word, str):
        return (), word
    if not (r.text(key) or "").strip().startswith("{"):
        raise AmqpOptionError(
            f"option 'startingOffsets' must be first, last, next (or latest) or a JSON object of offsets per stream, got {r.text(key)!r}"
        )
    _not_per_partition(key, discover)
    return _per_stream(r, key, streams, _start, "first, last, next (latest) or an offset >= 0"), "first"


def _ending(r: OptionReader, streams: tuple[str, ...], discover: str | None) -> tuple[tuple[tuple[str, End], ...], End | None]:
    """Per-stream ends (JSON forms) and the end of every other stream (None: not given)."""
    key = _one_of(r, ENDING_KEYS)
    if key is None:
        return (), None
    if key == "endingTimestamp":
        return (), At(r.integer(key, None, 0) or 0)
    if key == "endingOffsetsByTimestamp":
        _not_per_partition(key, discover)
        return _per_stream(r, key, streams, _moment, "a JSON object of epoch milliseconds per stream"), None
    if (r.text(key) or "").strip().lower() == "latest":
        return (), "latest"
    if not (r.text(key) or "").strip().startswith("{"):
        raise AmqpOptionError(f"option 'endingOffsets' must be latest or a JSON object of offsets per stream, got {r.text(key)!r}")
    _not_per_partition(key, discover)
    return _per_stream(r, key, streams, _end, "latest or an offset >= 0"), None
