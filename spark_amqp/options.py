"""Options both reading modes and the sink share (the connection, the trigger), and the sink's own, parsed
once into frozen, typed objects. Queue mode's are in ``queues/options.py``, stream mode's in
``streams/options.py``.

Validation happens here and only here, before anything connects. Keys are
matched case-insensitively (Spark lower-cases them anyway); an unknown key is an
error that lists the valid ones. The password lives only in
``ConnectionOptions.password``, which is excluded from ``repr``; everything that
is shown to a person uses ``ConnectionOptions.display_uri``. TLS and the login
(client certificates, SASL EXTERNAL, OAuth 2) are parsed in ``auth_options.py``. A uri may name
several nodes of a cluster (``amqp://user@host1:5672,host2:5672/vhost``): they
become ``ConnectionOptions.endpoints`` (see ``endpoints.py``).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .auth_options import OAuth2Options, TlsOptions, parse_login, parse_tls
from .endpoints import Endpoint, parse_endpoints
from .errors import AmqpOptionError
from .option_reader import OptionReader, ambiguity, redact_uri, split_uri

__all__ = [
    "ConnectionOptions",
    "SinkOptions",
    "TlsOptions",
    "TriggerOptions",
    "parse_connection",
    "parse_sink_options",
]

MAX_PREFETCH = 65535  # basic.qos prefetch_count is a 16-bit field
# Upper bounds: past these a value is a mistake (milliseconds for seconds), and a
# wait that long looks like a hang.
MAX_SECONDS_WAIT = 3600.0  # connectionTimeout, confirmTimeout
MAX_SECONDS_HEARTBEAT = 3600
# Spark's own spark.network.timeout is 2 minutes: past it, a query that cannot reach its broker fails, naming
# every endpoint and its last error, instead of showing an idle stream.
DEFAULT_OUTAGE_TIMEOUT = 120.0
MAX_OUTAGE_TIMEOUT = 7 * 86400.0
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # Kafka's maxTriggerDelay default (15m)
# Queue mode holds a delayed batch's deliveries unacknowledged: keep well under
# RabbitMQ's consumer_timeout (30 min by default).
MAX_TRIGGER_DELAY = 3600.0


# (stream protocol, TLS) -> the uri scheme that says so
_SCHEMES = {(False, False): "amqp", (False, True): "amqps", (True, False): "rabbitmq-stream", (True, True): "rabbitmq-stream+tls"}


@dataclass(frozen=True)
class ConnectionOptions:
    # Every node of the uri, in the order written; each connection tries them in an order of its own
    # (endpoints.EndpointOrder), so nothing connects to endpoints[0] directly.
    endpoints: tuple[Endpoint, ...]
    vhost: str
    username: str
    password: str = field(repr=False)
    tls: TlsOptions | None
    heartbeat: int
    connection_timeout: float
    stream_protocol: bool = False  # rabbitmq-stream://: RabbitMQ's stream protocol, not AMQP 0-9-1
    # How long a running query waits out a broker it cannot reach before it fails (the source's side).
    outage_timeout: float = 120.0
    # rabbitmq-stream:// through a load balancer: reach a stream's members through the uri, not at their advertised address.
    load_balancer: bool = False
    mechanism: str = "PLAIN"  # SASL: PLAIN (a password or an OAuth 2 token) or EXTERNAL (the client certificate)
    oauth2: OAuth2Options | None = None  # where the tokens that stand in for the password come from

    @property
    def display_uri(self) -> str:
        """The broker address for logs and errors: never the password."""
        scheme = _SCHEMES[(self.stream_protocol, self.tls is not None)]
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"{scheme}://{self.username}@{','.join(map(str, self.endpoints))}/{vhost}"

    @property
    def round_timeout(self) -> float:
        """How long one connection's walk over every endpoint may take: ``connectionTimeout`` each
        (a host whose name resolves to several addresses may take a multiple of it)."""
        return self.connection_timeout * len(self.endpoints)


@dataclass(frozen=True)
class TriggerOptions:
    """How much a micro-batch takes: at most ``max_messages``; with ``min_messages``, a batch
    waits until that many are there or ``max_delay`` seconds passed since the last one."""

    max_messages: int | None  # None: everything available (stream mode's default)
    min_messages: int | None = None
    max_delay: float = DEFAULT_MAX_TRIGGER_DELAY


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

    @property
    def target(self) -> str:
        """What the sink writes to, for errors: the stream, super stream or exchange."""
        if self.super_stream is not None:
            return f"super stream '{self.super_stream}'"
        if self.stream is not None:
            return f"stream '{self.stream}'"
        return f"exchange '{self.exchange}'"


# key (lower case) -> documented spelling
CONNECTION_KEYS = {
    k.lower(): k
    for k in (
        "uri",
        "password",
        "heartbeat",
        "connectionTimeout",
        "brokerOutageTimeout",
        "loadBalancer",
        "tls.caFile",
        "tls.certFile",
        "tls.keyFile",
        "tls.checkHostname",
        "tls.serverName",
        "tls.keyPassword",
        "authMechanism",
        "oauth2.tokenEndpoint",
        "oauth2.clientId",
        "oauth2.clientSecret",
        "oauth2.scope",
        "oauth2.tokenProvider",
    )
}
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
SINK_KEYS = CONNECTION_KEYS | {
    k.lower(): k
    for k in (
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
    )
}


STREAM_SCHEMES = ("rabbitmq-stream", "rabbitmq-stream+tls")
_DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671, "rabbitmq-stream": 5552, "rabbitmq-stream+tls": 5551}


def parse_connection(r: OptionReader, stream_protocol: bool = False) -> ConnectionOptions:
    """The connection options; ``stream_protocol``: the caller also takes rabbitmq-stream:// uris."""
    uri = r.required(
        "uri",
        "the broker address, e.g. amqp://user@host:5672/vhost, or amqp://user@host1,host2,host3/vhost for a cluster (put the password in option 'password')",
    ).strip()
    joined = _joined_uris(uri)
    if joined is not None:
        raise AmqpOptionError(
            f"option 'uri' holds more than one uri ({joined}): name every node in one uri, as "
            "amqp://user@host1:5672,host2:5672,host3:5672/vhost"
        )
    scheme, userinfo, address = split_uri(uri)
    shown = redact_uri(uri)
    unclear = ambiguity(uri)
    if unclear is not None:
        raise AmqpOptionError(
            f"option 'uri' can be read more than one way ({unclear}): percent-encode '/' in the user name as %2F, '@' in "
            "the password as %40 (or pass it in option 'password') and '@' in the vhost as %40, e.g. "
            "amqp://team%2Fetl@rabbit/prod with option 'password'"
        )
    if scheme in STREAM_SCHEMES and not stream_protocol:
        raise AmqpOptionError(f"option 'uri' is a stream-protocol uri ({shown}), which is not taken here: give an amqp:// or amqps:// uri")
    if scheme not in ("amqp", "amqps", *(STREAM_SCHEMES if stream_protocol else ())):
        also = ", amqps://, rabbitmq-stream:// or rabbitmq-stream+tls://" if stream_protocol else " or amqps://"
        raise AmqpOptionError(f"option 'uri' must start with amqp://{also}, got {shown}")
    hosts, rest = _host_list(address)
    if not hosts.strip():
        raise AmqpOptionError(f"option 'uri' has no host: {shown}")
    try:
        endpoints = parse_endpoints(hosts, _DEFAULT_PORTS[scheme])
        parts = urllib.parse.urlsplit(f"amqp://host{rest}")
    except ValueError as err:
        raise AmqpOptionError(f"option 'uri' is not a valid AMQP URI ({err}): {shown}") from None
    if parts.query or parts.fragment:
        raise AmqpOptionError(
            "option 'uri' must not carry query parameters; use the connector's options (heartbeat, connectionTimeout, tls.*)"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = urllib.parse.unquote(path) if path else "/"
    user, has_password, uri_password = (userinfo or "").partition(":")
    tls = parse_tls(r, scheme in ("amqps", "rabbitmq-stream+tls"))
    login = parse_login(r, urllib.parse.unquote(user) or None, urllib.parse.unquote(uri_password) if has_password else None, tls)
    heartbeat = r.integer("heartbeat", 60, 0, MAX_SECONDS_HEARTBEAT)
    load_balancer = r.boolean("loadBalancer", False)
    if load_balancer and scheme not in STREAM_SCHEMES:
        raise AmqpOptionError(
            "option 'loadBalancer' is for rabbitmq-stream:// uris (a stream is read on a node that holds it); over AMQP 0-9-1 "
            "any node serves every queue: leave it out"
        )
    assert heartbeat is not None
    return ConnectionOptions(
        endpoints=endpoints,
        vhost=vhost,
        username=login.username,
        password=login.password,
        tls=tls,
        heartbeat=heartbeat,
        connection_timeout=r.number("connectionTimeout", 30.0, 0.1, MAX_SECONDS_WAIT),
        stream_protocol=scheme in STREAM_SCHEMES,
        outage_timeout=r.duration("brokerOutageTimeout", DEFAULT_OUTAGE_TIMEOUT, 1.0, MAX_OUTAGE_TIMEOUT),
        load_balancer=load_balancer,
        mechanism=login.mechanism,
        oauth2=login.oauth2,
    )


# A scheme inside a uri, past its own: two uris pasted into one option.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _joined_uris(uri: str) -> str | None:
    """The uris ``uri`` holds, each without its password, when it holds more than one; else None."""
    starts = [m.start() for m in _SCHEME.finditer(uri)]
    if len(starts) < 2:
        return None
    pieces = [uri[a:b].rstrip(" ,;") for a, b in zip(starts, [*starts[1:], len(uri)], strict=True)]
    return ", ".join(redact_uri(p) for p in pieces)


def _host_list(address: str) -> tuple[str, str]:
    """(``host:port,host:port``, the path and what follows it) of the part of a uri after its credentials."""
    cut = min((i for i in (address.find(c) for c in "/?#") if i >= 0), default=len(address))
    return address[:cut], address[cut:]


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
    connection = parse_connection(r, stream_protocol=True)
    stream, deduplication = _stream_target(r, connection.stream_protocol)
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
    )


def _stream_target(r: OptionReader, stream_protocol: bool) -> tuple[str | None, bool]:
    """Option ``stream`` and ``deduplication``: only with a rabbitmq-stream:// uri, which takes no exchange options."""
    if not stream_protocol:
        for key in ("stream", "deduplication"):
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
