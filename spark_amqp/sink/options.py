"""The sink's options, parsed once into a frozen, typed ``SinkOptions`` before anything connects: the connection
(``transport/options.py``), then where and how rows are published. Every error names the option."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AmqpOptionError
from ..option_reader import OptionReader, keyed
from ..rabbitmq import EXCHANGE_TYPES, MAX_MESSAGE_SIZE_3X
from ..stream_protocol.compression import CODECS
from ..transport.options import CONNECTION_KEYS, MAX_SECONDS_WAIT, ConnectionOptions, parse_connection

__all__ = ["SINK_KEYS", "SinkOptions", "parse_sink_options"]


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
    # each row goes to one partition of this super stream, by its partition_key (else routing_key) column
    super_stream: str | None = None
    # the column whose value each message carries as x-stream-filter-value (stream filtering)
    filter_value_column: str = "filter_value"
    # rabbitmq-stream:// uris (the stream protocol): the stream to write to (else super_stream), and
    # whether each task publishes under producer names the broker deduplicates by (sink/producers.py)
    stream: str | None = None
    deduplication: bool = True
    # rabbitmq-stream:// uris: up to this many messages in one sub-entry (1: none), compressed with this codec
    # (stream_protocol/compression.py: none, gzip, snappy, lz4, zstd)
    sub_entry_size: int = 1
    compression: str = "none"

    @property
    def target(self) -> str:
        """What the sink writes to, for errors: the stream, super stream or exchange."""
        if self.super_stream is not None:
            return f"super stream '{self.super_stream}'"
        if self.stream is not None:
            return f"stream '{self.stream}'"
        return f"exchange '{self.exchange}'"


# Options that only mean something when publishing over AMQP 0-9-1 (an exchange routes each message).
AMQP_ONLY_SINK_KEYS = (
    "exchange",
    "mandatory",
    "declareExchange",
    "exchangeType",
    "exchangeDurable",
    "declareQueue",
    "queueArguments",
    "bindingKey",
)
SINK_KEYS = CONNECTION_KEYS | keyed(
    *AMQP_ONLY_SINK_KEYS,
    "routingKey",
    "persistent",
    "confirmTimeout",
    "maxInFlight",
    "maxMessageSize",
    "superStream",
    "filterValueColumn",
    "stream",
    "deduplication",
    "subEntrySize",
    "compression",
)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    r = OptionReader(options, SINK_KEYS)
    connection = parse_connection(r, stream_protocol=True)
    if connection.amqp10:
        _amqp10_only(r)
    stream, deduplication = _stream_target(r, connection.stream_protocol)
    sub_entry_size, codec = _sub_entries(r)
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
    super_stream = _super_stream(r)
    filter_value_column = (r.text("filterValueColumn", "filter_value") or "").strip()
    if not filter_value_column:
        raise AmqpOptionError("option 'filterValueColumn' takes the name of a string column")
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
        super_stream=super_stream,
        filter_value_column=filter_value_column,
        stream=stream,
        deduplication=deduplication,
        sub_entry_size=sub_entry_size,
        compression=codec,
    )


def _amqp10_only(r: OptionReader) -> None:
    """protocol=amqp1.0: a super stream's partitions are found over AMQP 0-9-1 (its exchange's bindings)."""
    if r.text("superStream") is not None:
        raise AmqpOptionError(
            "option 'superStream' is for AMQP 0-9-1 and the stream protocol: over AMQP 1.0 (protocol=amqp1.0) publish to "
            "the super stream's exchange with option 'exchange' and a routing key, or leave 'protocol' out"
        )


def _stream_target(r: OptionReader, stream_protocol: bool) -> tuple[str | None, bool]:
    """Option ``stream`` and ``deduplication``: only with a rabbitmq-stream:// uri, which takes no exchange options."""
    if not stream_protocol:
        for key in ("stream", "deduplication", "subEntrySize", "compression"):
            if r.text(key) is not None:
                raise AmqpOptionError(
                    f"option '{key}' needs a rabbitmq-stream:// uri (publishing over RabbitMQ's stream protocol); over AMQP "
                    "0-9-1 write to a stream with option routingKey=<stream name>"
                )
        return None, True
    for key in AMQP_ONLY_SINK_KEYS:
        if r.text(key) is not None:
            raise AmqpOptionError(
                f"option '{key}' does not apply to a rabbitmq-stream:// uri: the stream protocol writes to a stream (option "
                "'stream') or a super stream (option 'superStream') directly, with no exchange in between"
            )
    stream = r.text("stream")
    if stream is not None:
        stream = stream.strip()
        if not stream:
            raise AmqpOptionError("option 'stream' is empty: give the name of the stream to write to")
        if r.text("superStream") is not None:
            raise AmqpOptionError("options 'stream' and 'superStream' exclude each other: give one")
    elif r.text("superStream") is None:
        raise AmqpOptionError("a rabbitmq-stream:// uri needs option 'stream' (the stream to write to) or 'superStream'")
    return stream, r.boolean("deduplication", True)


def _sub_entries(r: OptionReader) -> tuple[int, str]:
    """Options ``subEntrySize`` and ``compression`` (checked for a rabbitmq-stream:// uri by ``_stream_target``)."""
    size = r.integer("subEntrySize", 1, 1, 65535)  # a sub-entry counts its messages in 16 bits
    assert size is not None
    codec = (r.text("compression", "none") or "none").strip().lower()
    if codec not in CODECS.values():
        raise AmqpOptionError(f"option 'compression' must be one of {', '.join(CODECS.values())}, got {r.text('compression')!r}")
    if codec != "none" and size == 1:
        raise AmqpOptionError(
            f"option 'compression' ({codec}) compresses sub-entries, several messages in one entry: give option "
            "'subEntrySize' too (e.g. 100, as RabbitMQ's Java client is often set)"
        )
    return size, codec


def _super_stream(r: OptionReader) -> str | None:
    name = r.text("superStream")
    if name is None:
        return None
    name = name.strip()
    if not name:
        raise AmqpOptionError("option 'superStream' is empty: give the super stream's name")
    for key in ("exchange", "declareExchange", "declareQueue"):
        if r.text(key) is not None:
            raise AmqpOptionError(
                f"options 'superStream' and '{key}' exclude each other: with a super stream, each row goes to the partition "
                "its key hashes to"
            )
    return name
