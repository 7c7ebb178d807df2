"""Every option the connector takes, parsed once into frozen, typed objects.

Validation happens here and only here, before anything connects. Keys are
matched case-insensitively (Spark lower-cases them anyway); an unknown key is an
error that lists the valid ones. The password lives only in
``ConnectionOptions.password``, which is excluded from ``repr``; everything that
is shown to a person uses ``ConnectionOptions.display_uri``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import AmqpOptionError
from .option_reader import OptionReader, ambiguity, redact_uri, split_uri

__all__ = [
    "ConnectionOptions",
    "JournalOptions",
    "QueueDeclaration",
    "SinkOptions",
    "SourceOptions",
    "TlsOptions",
    "TriggerOptions",
    "parse_connection",
    "parse_sink_options",
    "parse_source_options",
]

MAX_PREFETCH = 65535  # basic.qos prefetch_count is a 16-bit field
DEFAULT_PREFETCH = 20_000
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 10_000
DEFAULT_JOURNAL_RETENTION = 1800.0
# Upper bounds: past these a value is a mistake (milliseconds for seconds), and a
# wait that long looks like a hang.
MAX_SECONDS_WAIT = 3600.0  # connectionTimeout, confirmTimeout
MAX_SECONDS_HEARTBEAT = 3600
MAX_JOURNAL_RETENTION = 7 * 86400.0
DEDUPE_MODES = {"messageid": "messageId", "content": "content"}
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # Kafka's maxTriggerDelay default (15m)
# Queue mode holds a delayed batch's deliveries unacknowledged: keep well under
# RabbitMQ's consumer_timeout (30 min by default).
MAX_TRIGGER_DELAY = 3600.0


@dataclass(frozen=True)
class TlsOptions:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True)
class ConnectionOptions:
    host: str
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    tls: TlsOptions | None
    heartbeat: int
    connection_timeout: float

    @property
    def display_uri(self) -> str:
        """The broker address for logs and errors: never the password."""
        scheme = "amqps" if self.tls else "amqp"
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{vhost}"


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
class TriggerOptions:
    """How much a micro-batch takes: at most ``max_messages``; with ``min_messages``, a batch
    waits until that many are there or ``max_delay`` seconds passed since the last one."""

    max_messages: int | None  # None: everything available (stream mode's default)
    min_messages: int | None = None
    max_delay: float = DEFAULT_MAX_TRIGGER_DELAY


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
    trigger: TriggerOptions = TriggerOptions(DEFAULT_MAX_MESSAGES_PER_TRIGGER)
    # Without a journal: fail when a message's x-delivery-count reaches this (0: never); None: the
    # default for the broker's line (16 on RabbitMQ 4.x, whose delivery-limit is 20 by default; off on 3.x).
    max_delivery_count: int | None = None


@dataclass(frozen=True)
class SinkOptions:
    connection: ConnectionOptions
    exchange: str
    routing_key: str | None
    mandatory: bool
    persistent: bool
    confirm_timeout: float
    max_in_flight: int
    max_message_size: int | None  # None: the broker's default max_message_size, by its version
    declare_exchange: str | None  # exchange type to declare, or None
    exchange_durable: bool
    declare_queue: str | None
    queue_arguments: dict[str, Any]
    binding_key: str


# key (lower case) -> documented spelling
CONNECTION_KEYS = {
    k.lower(): k
    for k in (
        "uri",
        "password",
        "heartbeat",
        "connectionTimeout",
        "tls.caFile",
        "tls.certFile",
        "tls.keyFile",
        "tls.checkHostname",
    )
}
SOURCE_KEYS = CONNECTION_KEYS | {
    k.lower(): k
    for k in (
        "queue",
        "prefetch",
        "maxMessagesPerTrigger",
        "minMessagesPerTrigger",
        "maxTriggerDelay",
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
    )
}
SINK_KEYS = CONNECTION_KEYS | {
    k.lower(): k
    for k in (
        "exchange",
        "routingKey",
        "mandatory",
        "persistent",
        "confirmTimeout",
        "maxInFlight",
        "maxMessageSize",
        "declareExchange",
        "exchangeType",
        "exchangeDurable",
        "declareQueue",
        "queueArguments",
        "bindingKey",
    )
}


def parse_connection(r: OptionReader) -> ConnectionOptions:
    uri = r.required("uri", "the broker address, e.g. amqp://user@host:5672/vhost (put the password in option 'password')").strip()
    scheme, userinfo, address = split_uri(uri)
    shown = redact_uri(uri)
    unclear = ambiguity(uri)
    if unclear is not None:
        raise AmqpOptionError(
            f"option 'uri' can be read more than one way ({unclear}): percent-encode '/' in the user name as %2F, '@' in "
            "the password as %40 (or pass it in option 'password') and '@' in the vhost as %40, e.g. "
            "amqp://team%2Fetl@rabbit/prod with option 'password'"
        )
    if scheme not in ("amqp", "amqps"):
        raise AmqpOptionError(f"option 'uri' must start with amqp:// or amqps://, got {shown}")
    try:
        parts = urllib.parse.urlsplit(f"{scheme}://{address}")
        port = parts.port
    except ValueError as err:
        raise AmqpOptionError(f"option 'uri' is not a valid AMQP URI ({err}): {shown}") from None
    if not parts.hostname:
        raise AmqpOptionError(f"option 'uri' has no host: {shown}")
    if parts.query or parts.fragment:
        raise AmqpOptionError(
            "option 'uri' must not carry query parameters; use the connector's options (heartbeat, connectionTimeout, tls.*)"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = urllib.parse.unquote(path) if path else "/"
    user, has_password, uri_password = (userinfo or "").partition(":")
    username = urllib.parse.unquote(user) if user else "guest"
    password = r.text("password")
    if password is None:
        password = urllib.parse.unquote(uri_password) if has_password else "guest"
    tls_keys = ("tls.caFile", "tls.certFile", "tls.keyFile", "tls.checkHostname")
    tls: TlsOptions | None = None
    if scheme == "amqps":
        tls = TlsOptions(
            r.readable_file("tls.caFile"),
            r.readable_file("tls.certFile"),
            r.readable_file("tls.keyFile"),
            r.boolean("tls.checkHostname", True),
        )
        if (tls.cert_file is None) != (tls.key_file is None):
            raise AmqpOptionError("options 'tls.certFile' and 'tls.keyFile' go together: give both or neither")
    elif any(r.text(k) is not None for k in tls_keys):
        raise AmqpOptionError("tls.* options need an amqps:// uri")
    heartbeat = r.integer("heartbeat", 60, 0, MAX_SECONDS_HEARTBEAT)
    assert heartbeat is not None
    return ConnectionOptions(
        host=parts.hostname,
        port=port or (5671 if tls else 5672),
        vhost=vhost,
        username=username,
        password=password,
        tls=tls,
        heartbeat=heartbeat,
        connection_timeout=r.number("connectionTimeout", 30.0, 0.1, MAX_SECONDS_WAIT),
    )


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
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
    )


def parse_trigger(r: OptionReader, max_messages: int | None) -> TriggerOptions:
    minimum = r.integer("minMessagesPerTrigger", None, 1)
    if minimum is None:
        if r.text("maxTriggerDelay") is not None:
            raise AmqpOptionError("option 'maxTriggerDelay' only applies with option 'minMessagesPerTrigger'")
        return TriggerOptions(max_messages)
    if max_messages is not None and minimum > max_messages:
        raise AmqpOptionError(
            f"option 'minMessagesPerTrigger' ({minimum}) is larger than 'maxMessagesPerTrigger' ({max_messages}): "
            "a batch could never be both"
        )
    return TriggerOptions(max_messages, minimum, r.duration("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY, 0.001, MAX_TRIGGER_DELAY))


# RabbitMQ's default max_message_size: 128 MiB up to 3.x, 16 MiB from 4.0 (a larger body closes the channel, 406).
MAX_MESSAGE_SIZE_3X = 134_217_728
MAX_MESSAGE_SIZE_4X = 16_777_216
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    r = OptionReader(options, SINK_KEYS)
    connection = parse_connection(r)
    exchange = r.text("exchange", "") or ""
    routing_key = r.text("routingKey")
    if routing_key is not None and len(routing_key.encode("utf-8")) > 255:
        raise AmqpOptionError(f"option 'routingKey' is longer than 255 bytes ({len(routing_key.encode('utf-8'))})")
    if len(exchange.encode("utf-8")) > 255:
        raise AmqpOptionError("option 'exchange' is longer than 255 bytes")
    declare_exchange = None
    if r.boolean("declareExchange", False):
        if not exchange:
            raise AmqpOptionError("option 'declareExchange' needs option 'exchange' (the default exchange cannot be declared)")
        declare_exchange = (r.text("exchangeType", "direct") or "direct").lower()
        if declare_exchange not in EXCHANGE_TYPES:
            raise AmqpOptionError(f"option 'exchangeType' must be one of {', '.join(EXCHANGE_TYPES)}, got {declare_exchange!r}")
    elif r.text("exchangeType") is not None or r.text("exchangeDurable") is not None:
        raise AmqpOptionError("options 'exchangeType' and 'exchangeDurable' only apply with declareExchange=true")
    declare_queue = r.text("declareQueue")
    if declare_queue is not None and declare_queue.strip() == "":
        raise AmqpOptionError("option 'declareQueue' takes the name of a queue to declare")
    if declare_queue is None and (r.text("queueArguments") is not None or r.text("bindingKey") is not None):
        raise AmqpOptionError("options 'queueArguments' and 'bindingKey' only apply with declareQueue=<queue name>")
    confirm_timeout = r.number("confirmTimeout", 30.0, 0.001, MAX_SECONDS_WAIT)
    max_in_flight = r.integer("maxInFlight", 1000, 1, 1_000_000)
    max_message_size = r.integer("maxMessageSize", None, 1, MAX_MESSAGE_SIZE_3X * 4)
    assert max_in_flight is not None
    return SinkOptions(
        connection=connection,
        exchange=exchange,
        routing_key=routing_key,
        mandatory=r.boolean("mandatory", True),
        persistent=r.boolean("persistent", True),
        confirm_timeout=confirm_timeout,
        max_in_flight=max_in_flight,
        max_message_size=max_message_size,
        declare_exchange=declare_exchange,
        exchange_durable=r.boolean("exchangeDurable", True),
        declare_queue=declare_queue.strip() if declare_queue else None,
        queue_arguments=r.json_object("queueArguments"),
        binding_key=r.text("bindingKey", "") or "",
    )
