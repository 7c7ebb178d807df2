"""The connection's options, which every reading mode and the sink take, parsed once into a frozen, typed
``ConnectionOptions``. The trigger's are in ``reading/trigger.py``, queue mode's in ``queues/options.py``,
stream mode's in ``streams/options.py``, the sink's in ``sink/options.py``.

Validation of these keys happens here and only here, before anything connects. Keys are
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
from dataclasses import dataclass, field

from ..errors import AmqpOptionError
from ..option_reader import OptionReader, ambiguity, keyed, redact_uri, split_uri
from .auth_options import LOGIN_KEYS, TLS_KEYS, OAuth2Options, TlsOptions, parse_login, parse_tls
from .endpoints import Endpoint, parse_endpoints

__all__ = ["CONNECTION_KEYS", "STREAM_SCHEMES", "ConnectionOptions", "TlsOptions", "parse_connection"]

# Upper bounds: past these a value is a mistake (milliseconds for seconds), and a
# wait that long looks like a hang.
MAX_SECONDS_WAIT = 3600.0  # connectionTimeout (the sink's confirmTimeout too)
MAX_SECONDS_HEARTBEAT = 3600
# Spark's own spark.network.timeout is 2 minutes: past it, a query that cannot reach its broker fails, naming
# every endpoint and its last error, instead of showing an idle stream.
DEFAULT_OUTAGE_TIMEOUT = 120.0
MAX_OUTAGE_TIMEOUT = 7 * 86400.0


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
    # amqp:// uris, stream mode: the stream protocol's port on the uri's hosts, where a read over AMQP 0-9-1 asks what
    # RabbitMQ did not deliver (None: its default, 5552 or 5551 with TLS)
    stream_port: int | None = None
    mechanism: str = "PLAIN"  # SASL: PLAIN (a password or an OAuth 2 token) or EXTERNAL (the client certificate)
    oauth2: OAuth2Options | None = None  # where the tokens that stand in for the password come from
    amqp10: bool = False  # protocol=amqp1.0: AMQP 1.0 on the amqp:// uri's port, not AMQP 0-9-1

    @property
    def display_uri(self) -> str:
        """The broker address for logs and errors: never the password."""
        scheme = _SCHEMES[(self.stream_protocol, self.tls is not None)]
        vhost = urllib.parse.quote(self.vhost, safe="")
        over = " (AMQP 1.0)" if self.amqp10 else ""
        return f"{scheme}://{self.username}@{','.join(map(str, self.endpoints))}/{vhost}{over}"

    @property
    def round_timeout(self) -> float:
        """How long one connection's walk over every endpoint may take: ``connectionTimeout`` each
        (a host whose name resolves to several addresses may take a multiple of it)."""
        return self.connection_timeout * len(self.endpoints)


# key (lower case) -> documented spelling
CONNECTION_KEYS = keyed(
    "uri", "protocol", "password", "heartbeat", "connectionTimeout", "brokerOutageTimeout", "loadBalancer", *TLS_KEYS, *LOGIN_KEYS
)


STREAM_SCHEMES = ("rabbitmq-stream", "rabbitmq-stream+tls")
_DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671, "rabbitmq-stream": 5552, "rabbitmq-stream+tls": 5551}
# Option 'protocol': what an amqp:// or amqps:// uri speaks. RabbitMQ 4 serves both on one port, so the
# uri cannot say; the spelling is lower-cased before it is looked up.
PROTOCOLS = {"amqp0-9-1": False, "amqp1.0": True}


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
    amqp10 = _protocol(r, scheme, shown)
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
        amqp10=amqp10,
    )


def _protocol(r: OptionReader, scheme: str, shown: str) -> bool:
    given = r.text("protocol")
    if given is None:
        return False
    amqp10 = PROTOCOLS.get(given.strip().lower())
    if amqp10 is None:
        raise AmqpOptionError(f"option 'protocol' must be amqp0-9-1 or amqp1.0, got {given!r}")
    if scheme in STREAM_SCHEMES:
        raise AmqpOptionError(
            f"option 'protocol' is for amqp:// and amqps:// uris: {shown} speaks RabbitMQ's stream protocol. Give an amqp:// "
            "uri with protocol=amqp1.0 to use AMQP 1.0"
        )
    return amqp10


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
