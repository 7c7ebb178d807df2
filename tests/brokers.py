"""The brokers under test, and broker-agnostic checks (ready/unacked counts, dropping connections).

Real RabbitMQ nodes come from ``AMQP_TEST_BROKERS`` (``name=url`` pairs separated by spaces,
as ``tools/rabbitmq urls`` prints them, e.g. ``3.10=amqp://… 4.3=amqp://…``), or from
``AMQP_TEST_URL`` for a single node called ``rabbitmq``. Each has a version, read from the
broker's own ``version`` server property, so that a test can say what each line does where
RabbitMQ 3.10 and 4.x differ. The embedded broker models the newest 4.x line CI runs.

A cluster, named by one uri that lists its nodes (``tools/rabbitmq cluster-url`` and
``cluster-stream-url``), comes from ``AMQP_TEST_CLUSTER_URL`` and ``AMQP_TEST_CLUSTER_STREAM_URL``;
the tests in ``tests/cluster`` are skipped without them. The TLS node (``AMQP_TEST_TLS_URL`` and the
rest, below) runs ``tests/auth``.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pika
from spark_amqp_broker import EmbeddedBroker
from spark_amqp_broker.server import MODELLED_VERSION

from spark_amqp.transport.connection import parse_version

TOOLS = Path(__file__).resolve().parent.parent / "tools" / "rabbitmq"


@dataclass(frozen=True)
class RealBroker:
    name: str  # "3.10", "4.0", "4.3", or "rabbitmq" (AMQP_TEST_URL)
    url: str

    @property
    def ctl(self) -> list[str]:
        """The rabbitmqctl command for this node (inside its chroot for the nodes tools/rabbitmq runs)."""
        override = os.environ.get("AMQP_TEST_CTL")
        if override and self.name == "rabbitmq":
            return shlex.split(override)
        if self.name == "rabbitmq":
            return ["rabbitmqctl"]
        return [str(TOOLS), "ctl", self.name]

    @property
    def eval(self) -> list[str] | None:
        """erl_call on this node (``tools/rabbitmq eval``, an expression on stdin); None for a broker tools/rabbitmq
        does not run."""
        return None if self.name == "rabbitmq" else [str(TOOLS), "eval", self.name]

    @functools.cached_property
    def version(self) -> tuple[int, int]:
        return version_of(self.url)


def _parse_real() -> list[RealBroker]:
    listed = os.environ.get("AMQP_TEST_BROKERS", "").split()
    if listed:
        out = []
        for item in listed:
            name, sep, url = item.partition("=")
            if not sep or not url:
                raise RuntimeError(f"AMQP_TEST_BROKERS: {item!r} is not name=url")
            out.append(RealBroker(name, url))
        return out
    single = os.environ.get("AMQP_TEST_URL")
    return [RealBroker("rabbitmq", single)] if single else []


REAL = _parse_real()
_BY_URL = {b.url: b for b in REAL}
# The stream-protocol url of each broker that has one, by its AMQP 0-9-1 url (AMQP_TEST_STREAM_BROKERS names
# the real nodes as AMQP_TEST_BROKERS does; the embedded brokers add themselves, see note_embedded).
_STREAM_BY_NAME = dict(item.partition("=")[::2] for item in os.environ.get("AMQP_TEST_STREAM_BROKERS", "").split())
STREAM_URLS = {b.url: _STREAM_BY_NAME[b.name] for b in REAL if b.name in _STREAM_BY_NAME}


# A cluster's nodes in one uri each (amqp://…@host1:port1,host2:port2/vhost), or None.
CLUSTER_URL = os.environ.get("AMQP_TEST_CLUSTER_URL") or None
CLUSTER_STREAM_URL = os.environ.get("AMQP_TEST_CLUSTER_STREAM_URL") or None

# The TLS node (tools/rabbitmq's "tls": client certificates verified, EXTERNAL, OAuth 2 tokens signed by the
# key in its tls-dir): its amqps:// and rabbitmq-stream+tls:// uris, its test certificates, and its plain
# amqp:// and rabbitmq-stream:// uris (token logins). tests/auth and test_managed_logins skip without them.
TLS_URL = os.environ.get("AMQP_TEST_TLS_URL") or None
TLS_STREAM_URL = os.environ.get("AMQP_TEST_TLS_STREAM_URL") or None
TLS_DIR = os.environ.get("AMQP_TEST_TLS_DIR") or None
OAUTH_URL = os.environ.get("AMQP_TEST_OAUTH_URL") or None
OAUTH_STREAM_URL = os.environ.get("AMQP_TEST_OAUTH_STREAM_URL") or None


def tls_ctl(*args: str) -> str:
    """rabbitmqctl for the TLS node (``AMQP_TEST_TLS_CTL`` to run another command)."""
    override = os.environ.get("AMQP_TEST_TLS_CTL")
    command = shlex.split(override) if override else [str(TOOLS), "ctl", "tls"]
    return subprocess.run([*command, *args], check=True, capture_output=True, text=True, timeout=60).stdout


# The embedded brokers a test run started, by url: checks that take a url alone (counts, dropping connections,
# reading_url over AMQP 1.0) find them here.
EMBEDDED: dict[str, EmbeddedBroker] = {}


def note_embedded(broker: EmbeddedBroker) -> EmbeddedBroker:
    stream_url = getattr(broker, "stream_url", None)
    if stream_url:
        STREAM_URLS[broker.url] = stream_url
    EMBEDDED[broker.url] = broker
    return broker


def version_of(url: str) -> tuple[int, int]:
    """(major, minor) of the broker at ``url``, from its ``version`` server property."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        raw = conn._impl.server_properties.get("version", b"")
    finally:
        conn.close()
    version = parse_version(raw)
    if version is None:
        raise RuntimeError(f"{url}: no version in the server properties ({raw!r})")
    return version


def by_version() -> list[RealBroker]:
    return sorted(REAL, key=lambda b: b.version)


def version(url: str, embedded: EmbeddedBroker | None = None) -> tuple[int, int]:
    """The RabbitMQ line the broker at ``url`` behaves as (the embedded broker models MODELLED_VERSION)."""
    if embedded is not None and url == embedded.url:
        return MODELLED_VERSION
    real = _BY_URL.get(url)
    return real.version if real is not None else version_of(url)


def _ctl(url: str, *args: str) -> str:
    real = _BY_URL.get(url)
    command = real.ctl if real is not None else ["rabbitmqctl"]
    return subprocess.run([*command, *args], check=True, capture_output=True, text=True, timeout=60).stdout


def counts(url: str, queue: str, embedded: EmbeddedBroker | None) -> tuple[int, int]:
    """(ready, unacked) for ``queue``."""
    embedded = embedded or EMBEDDED.get(url)
    if embedded is not None and url == embedded.url:
        stats = embedded.queue_stats(queue)
        return stats["ready"], stats["unacked"]
    real = _BY_URL.get(url)
    if real is not None and real.eval is not None:
        return _counts_by_eval(real.eval, queue)
    out = _ctl(url, "list_queues", "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged")
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == queue:
            return int(parts[1]), int(parts[2])
    raise KeyError(queue)


_COUNTS = re.compile(r"\{messages_ready, *(\d+)\}, *\{messages_unacknowledged, *(\d+)\}")


def _counts_by_eval(command: list[str], queue: str) -> tuple[int, int]:
    """What ``rabbitmqctl list_queues`` says of ``queue`` in vhost /, asked by erl_call: the tests poll counts, and each
    rabbitmqctl call starts an Erlang VM (about 1 s of CPU, on a CI machine whose two cores the lanes share)."""
    name = queue.replace("\\", "\\\\").replace('"', '\\"')
    expression = (
        f'case rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{name}">>)) of '
        "{ok, Q} -> rabbit_amqqueue:info(Q, [messages_ready, messages_unacknowledged]); Other -> Other end.\n"
    )
    done = subprocess.run(command, input=expression, capture_output=True, text=True, timeout=60)
    out = done.stdout
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip() or out.strip()}")
    found = _COUNTS.search(out)
    if found is None:
        if "not_found" in out:
            raise KeyError(queue)
        raise AssertionError(f"erl_call's answer about queue {queue!r}: {out!r}")
    return int(found[1]), int(found[2])


def publish(url: str, queue: str, bodies: list[bytes], declare: bool = True, **props_kwargs: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if declare:
        ch.queue_declare(queue)
    ch.confirm_delivery()
    for i, body in enumerate(bodies):
        props = pika.BasicProperties(**{k: (v(i) if callable(v) else v) for k, v in props_kwargs.items()})
        ch.basic_publish("", queue, body, props)
    conn.close()


def drop_source_connections(url: str, embedded: EmbeddedBroker | None, name_contains: str = "spark-amqp source") -> int:
    """Cut the connections whose client name holds ``name_contains`` (by default the streaming source's
    consumer connections), as a network failure would; how many were cut."""
    embedded = embedded or EMBEDDED.get(url)
    if embedded is not None and url == embedded.url:
        return embedded.drop_connections(name_contains=name_contains)
    listing = _ctl(url, "list_connections", "-q", "--no-table-headers", "pid", "client_properties")
    cut = 0
    for line in listing.splitlines():
        pid, _, props = line.partition("\t")
        if name_contains in props and "depth" not in props:
            _ctl(url, "close_connection", pid, "test: connection dropped")
            cut += 1
    return cut
