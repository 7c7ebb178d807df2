"""Options of the source in stream mode (``stream`` or ``superStream`` instead of ``queue``).

RabbitMQ stream queues are append-only logs with offsets, so this mode needs
neither a journal nor an exclusive consumer: its offsets are stream positions,
and a replayed batch re-reads the same ones. Validation happens here, before
anything connects; connection options are shared with queue mode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import AmqpOptionError
from ..option_reader import OptionReader
from ..options import CONNECTION_KEYS, MAX_PREFETCH, ConnectionOptions, TriggerOptions, parse_connection, parse_trigger

__all__ = ["STARTS", "StreamSourceOptions", "is_stream_mode", "parse_stream_options"]

STARTS = ("first", "last", "next")
DEFAULT_MIN_PARTITION_SIZE = 50_000
DEFAULT_STREAM_PREFETCH = 2_000

STREAM_KEYS = CONNECTION_KEYS | {
    k.lower(): k
    for k in (
        "stream",
        "superStream",
        "superStreamPartitions",
        "startingOffsets",
        "startingTimestamp",
        "failOnDataLoss",
        "maxMessagesPerTrigger",
        "minMessagesPerTrigger",
        "maxTriggerDelay",
        "numPartitions",
        "minPartitionSize",
        "prefetch",
    )
}
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
    # where a new query starts, per stream: "first", "last", "next" or an offset
    starting: tuple[tuple[str, str | int], ...]
    starting_timestamp: int | None  # epoch milliseconds, instead of ``starting``
    fail_on_data_loss: bool
    trigger: TriggerOptions
    num_partitions: int | None
    min_partition_size: int
    prefetch: int

    def start_of(self, stream: str) -> str | int:
        return dict(self.starting).get(stream, "first")


def is_stream_mode(options: Mapping[str, str]) -> bool:
    return any(k.lower() in ("stream", "superstream") for k in options)


def parse_stream_options(options: Mapping[str, str]) -> StreamSourceOptions:
    for key in options:
        if key.lower() in QUEUE_ONLY:
            raise AmqpOptionError(f"option '{key}' does not apply to streams: {QUEUE_ONLY[key.lower()]}")
    r = OptionReader(options, STREAM_KEYS)
    connection = parse_connection(r)
    streams = _streams(r)
    starting, timestamp = _starting(r, streams)
    max_messages = r.integer("maxMessagesPerTrigger", None, 1)
    return StreamSourceOptions(
        connection=connection,
        streams=streams,
        starting=starting,
        starting_timestamp=timestamp,
        fail_on_data_loss=r.boolean("failOnDataLoss", True),
        trigger=parse_trigger(r, max_messages),
        num_partitions=r.integer("numPartitions", None, 1, 10_000),
        min_partition_size=r.integer("minPartitionSize", DEFAULT_MIN_PARTITION_SIZE, 1) or DEFAULT_MIN_PARTITION_SIZE,
        prefetch=r.integer("prefetch", DEFAULT_STREAM_PREFETCH, 1, MAX_PREFETCH) or DEFAULT_STREAM_PREFETCH,
    )


def _streams(r: OptionReader) -> tuple[str, ...]:
    plain, sup = r.text("stream"), r.text("superStream")
    if plain is not None and sup is not None:
        raise AmqpOptionError("options 'stream' and 'superStream' exclude each other: give one")
    if sup is not None:
        name = sup.strip()
        if not name:
            raise AmqpOptionError("option 'superStream' is empty: give the super stream's name")
        count = r.integer("superStreamPartitions", None, 1, 10_000)
        if count is None:
            raise AmqpOptionError(
                "option 'superStreamPartitions' is required with 'superStream': AMQP 0-9-1 cannot list a super "
                f"stream's partitions, so give their number (the streams '{name}-0' ... '{name}-<N-1>')"
            )
        streams = tuple(f"{name}-{i}" for i in range(count))
    else:
        if r.text("superStreamPartitions") is not None:
            raise AmqpOptionError("option 'superStreamPartitions' only applies with option 'superStream'")
        streams = r.names("stream", "stream")
    if any(len(s.encode("utf-8")) > 255 for s in streams):
        raise AmqpOptionError(f"option 'superStream': the name is too long for its partition streams ({streams[-1][:40]!r}...)")
    return streams


def _starting(r: OptionReader, streams: tuple[str, ...]) -> tuple[tuple[tuple[str, str | int], ...], int | None]:
    raw = r.text("startingOffsets")
    stamp = r.integer("startingTimestamp", None, 0)
    if raw is not None and stamp is not None:
        raise AmqpOptionError("options 'startingOffsets' and 'startingTimestamp' exclude each other: give one")
    if stamp is not None:
        return (), stamp
    if raw is None:
        return tuple((s, "first") for s in streams), None
    text = raw.strip()
    if text.lower() in STARTS:
        return tuple((s, text.lower()) for s in streams), None
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        raise AmqpOptionError(
            f"option 'startingOffsets' must be first, last, next or a JSON object of offsets per stream, got {raw!r}"
        ) from None
    if not isinstance(given, dict):
        raise AmqpOptionError(f"option 'startingOffsets' must be a JSON object such as {{\"{streams[0]}\": 0}}, got {raw!r}")
    unknown = sorted(set(given) - set(streams))
    missing = [s for s in streams if s not in given]
    if unknown:
        raise AmqpOptionError(f"option 'startingOffsets' names streams this query does not read: {', '.join(unknown)}")
    if missing:
        raise AmqpOptionError(f"option 'startingOffsets' has no offset for: {', '.join(missing)} (give first, last, next or a number)")
    starting: list[tuple[str, str | int]] = []
    for stream in streams:
        value = given[stream]
        if isinstance(value, str) and value.lower() in STARTS:
            starting.append((stream, value.lower()))
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            starting.append((stream, value))
        else:
            raise AmqpOptionError(
                f"option 'startingOffsets': stream '{stream}' must start at first, last, next or an offset >= 0, got {value!r}"
            )
    return tuple(starting), None
