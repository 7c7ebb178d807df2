"""Queue mode's options (``option("queue")``), parsed once into frozen, typed objects, before anything
connects; the connection and trigger options are shared (``transport/options.py``, ``reading/trigger.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import AmqpOptionError
from ..option_reader import OptionReader, keyed, redact_uri
from ..rabbitmq import MAX_PREFETCH
from ..reading.projection import Projection, projection
from ..reading.trigger import TRIGGER_KEYS, TriggerOptions, parse_trigger
from ..transport.options import CONNECTION_KEYS, ConnectionOptions, parse_connection

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["JournalOptions", "QueueDeclaration", "SourceOptions", "parse_source_options"]

# A batch costs Spark about 0.45 s whatever its size (offset and commit logs, a job), and the broker can
# only deliver the next batch while this one is in flight inside the prefetch window (2 batches), so the
# rate is at most a batch per 0.45 s. Measured on RabbitMQ 4.3 (200 B messages, 2 cores): 10,000 a batch
# read 15-16k msg/s, 20,000 read 25-28k, 32,000 read 25-28k (RabbitMQ's queue then spends 50% more CPU a
# message on what is outstanding); the prefetch it implies (40,000) bounds the memory held.
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 20_000
DEFAULT_PREFETCH = 20_000
DEFAULT_JOURNAL_RETENTION = 1800.0
MAX_JOURNAL_RETENTION = 7 * 86400.0
DEDUPE_MODES = {"messageid": "messageId", "content": "content"}

DEFAULT_TRIGGER = TriggerOptions(DEFAULT_MAX_MESSAGES_PER_TRIGGER)  # frozen: one instance serves every default


@dataclass(frozen=True)
class QueueDeclaration:
    durable: bool
    arguments: dict[str, Any]
    exchange: str | None
    binding_key: str


@dataclass(frozen=True)
class JournalOptions:
    location: str  # as given: a local path, /Volumes/..., file://, s3://, ... (shown only via display_location)
    retention: float  # seconds a copy of a journalled batch is still expected back from the broker

    @property
    def display_location(self) -> str:
        return redact_uri(self.location)


@dataclass(frozen=True)
class SourceOptions:
    connection: ConnectionOptions
    queues: tuple[str, ...]
    prefetch: int
    max_messages_per_trigger: int
    num_partitions: int | None
    declaration: QueueDeclaration | None
    journal: JournalOptions | None = None  # None: at-least-once
    dedupe_by: str = "messageId"  # how a redelivered copy is recognised: "messageId" or "content"
    exclusive_consumer: bool = False
    trigger: TriggerOptions = DEFAULT_TRIGGER
    # Without a journal: fail when a message's x-delivery-count reaches this (0: never); None: the
    # default for the broker's line (16 on RabbitMQ 4.x, whose delivery-limit is 20 by default; off on 3.x).
    max_delivery_count: int | None = None
    # onDeliveryLimit=deadLetter: a message at maxDeliveryCount is dead-lettered (AMQP 1.0's modified outcome, with a
    # reason) rather than failing the query
    dead_letter_at_limit: bool = False
    # the columns the query's schema asks for (``.schema(...)``); None: every column
    columns: Projection | None = None


SOURCE_KEYS = CONNECTION_KEYS | keyed(
    "queue",
    "prefetch",
    *TRIGGER_KEYS,
    "numPartitions",
    "declareQueue",
    "queueDurable",
    "queueArguments",
    "bindExchange",
    "bindingKey",
    "journalLocation",
    "journalRetention",
    "dedupeBy",
    "exclusiveConsumer",
    "maxDeliveryCount",
    "onDeliveryLimit",
)


def parse_source_options(options: Mapping[str, str], schema: StructType | None = None) -> SourceOptions:
    """The options, checked, and the columns ``schema`` (the reader's, if the query gave one) asks for."""
    r = OptionReader(options, SOURCE_KEYS)
    connection = parse_connection(r)
    queues = r.names("queue", "queue")
    max_per_trigger = r.integer("maxMessagesPerTrigger", DEFAULT_MAX_MESSAGES_PER_TRIGGER, 1)
    assert max_per_trigger is not None
    default_prefetch = min(MAX_PREFETCH, max(DEFAULT_PREFETCH, 2 * max_per_trigger))
    prefetch = r.integer("prefetch", default_prefetch, 1, MAX_PREFETCH)
    assert prefetch is not None
    journalled = r.text("journalLocation") is not None
    # Without a journal one batch waits for its commit while the next fills; both are unacked.
    # With one, a batch is acknowledged as soon as it is journalled.
    if prefetch < (1 if journalled else 2) * max_per_trigger:
        if journalled:
            raise AmqpOptionError(
                f"option 'prefetch' ({prefetch}) must be at least 'maxMessagesPerTrigger' ({max_per_trigger}): a batch is "
                f"taken from the deliveries the prefetch window lets in; raise 'prefetch' or lower 'maxMessagesPerTrigger'"
            )
        raise AmqpOptionError(
            f"option 'prefetch' ({prefetch}) must be at least twice 'maxMessagesPerTrigger' ({max_per_trigger}): "
            "a committed batch stays unacknowledged until the next one is planned, so both must fit in the "
            f"prefetch window; raise 'prefetch' to {2 * max_per_trigger} or lower 'maxMessagesPerTrigger' (with "
            "journalLocation, prefetch need only hold one batch)"
        )
    declaration = None
    if r.boolean("declareQueue", False):
        declaration = QueueDeclaration(
            durable=r.boolean("queueDurable", True),
            arguments=r.json_object("queueArguments"),
            exchange=r.text("bindExchange"),
            binding_key=r.text("bindingKey", "") or "",
        )
    else:
        stray = [r.name(k) for k in ("queueDurable", "queueArguments", "bindExchange", "bindingKey") if r.text(k) is not None]
        if stray:
            raise AmqpOptionError(f"option(s) {', '.join(stray)} only apply with declareQueue=true")
    journal = None
    location = r.text("journalLocation")
    if location is not None:
        if location.strip() == "":
            raise AmqpOptionError("option 'journalLocation' is empty: give a directory on durable storage, or leave it out")
        journal = JournalOptions(location.strip(), r.number("journalRetention", DEFAULT_JOURNAL_RETENTION, 1.0, MAX_JOURNAL_RETENTION))
    elif r.text("journalRetention") is not None:
        raise AmqpOptionError("option 'journalRetention' only applies with option 'journalLocation'")
    max_delivery_count = r.integer("maxDeliveryCount", None, 0, 1_000_000)
    if journal is not None and max_delivery_count is not None:
        raise AmqpOptionError(
            "option 'maxDeliveryCount' only applies without 'journalLocation': with a journal, a message a quorum queue "
            "returned is journalled and acknowledged at once, so its delivery-limit cannot drop it"
        )
    dead_letter = _on_delivery_limit(r, connection, journal is not None, max_delivery_count)
    dedupe = (r.text("dedupeBy", "messageId") or "").strip()
    if dedupe.lower() not in DEDUPE_MODES:
        raise AmqpOptionError(f"option 'dedupeBy' must be messageId or content, got {dedupe!r}")
    trigger = parse_trigger(r, max_per_trigger)
    return SourceOptions(
        connection=connection,
        queues=queues,
        prefetch=prefetch,
        max_messages_per_trigger=max_per_trigger,
        num_partitions=r.integer("numPartitions", None, 1, 10_000),
        declaration=declaration,
        journal=journal,
        dedupe_by=DEDUPE_MODES[dedupe.lower()],
        # Exactly-once holds only while one query reads each queue: enforce it by default.
        exclusive_consumer=r.boolean("exclusiveConsumer", journal is not None),
        trigger=trigger,
        max_delivery_count=max_delivery_count,
        dead_letter_at_limit=dead_letter,
        columns=projection(schema, "queue"),
    )


def _on_delivery_limit(r: OptionReader, connection: ConnectionOptions, journalled: bool, max_delivery_count: int | None) -> bool:
    """Whether onDeliveryLimit asks to dead-letter a message at maxDeliveryCount (else the query fails there)."""
    raw = (r.text("onDeliveryLimit", "fail") or "").strip()
    if raw.lower() not in ("fail", "deadletter"):
        raise AmqpOptionError(f"option 'onDeliveryLimit' must be fail or deadLetter, got {raw!r}")
    if raw.lower() == "fail":
        return False
    if journalled:
        raise AmqpOptionError(
            "option 'onDeliveryLimit' only applies without 'journalLocation': with a journal, a message a quorum queue "
            "returned is journalled and acknowledged at once, so it never reaches a limit"
        )
    if not connection.amqp10:
        raise AmqpOptionError(
            "option 'onDeliveryLimit=deadLetter' settles a message with AMQP 1.0's modified outcome, which carries the reason "
            "to the dead-letter queue: set option 'protocol' to 'amqp1.0' (RabbitMQ 4.x)"
        )
    if max_delivery_count == 0:
        raise AmqpOptionError("option 'onDeliveryLimit=deadLetter' needs a limit: maxDeliveryCount=0 sets none")
    return True
