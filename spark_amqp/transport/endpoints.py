"""The broker's endpoints: the ``host:port`` list of a uri, and the order one connection tries them in.

A cluster is named in one uri, ``amqp://user@host1:5672,host2:5672,host3/vhost``, as RabbitMQ's
clients take a list of addresses. Each connection walks the endpoints in a fresh random order,
as RabbitMQ's Java client shuffles its address list for every connection: connections spread over
the nodes, and a reconnect after a node went away most likely tries another one first. Pure (no
sockets); the walk itself is in ``dial.py``.
"""

from __future__ import annotations

import ipaddress
import random
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["ORDER", "Endpoint", "EndpointOrder", "parse_endpoints"]

T = TypeVar("T")

# A host name as DNS and /etc/hosts spell it (IDN letters included); anything else is a typo or a
# fragment of something that is not a host list.
_HOST_NAME = re.compile(r"[\w.~-]+")


@dataclass(frozen=True)
class Endpoint:
    host: str  # a DNS name (lower case), an IPv4 address, or an IPv6 address without its brackets
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class EndpointOrder:
    """The order of one round over a list: shuffled afresh every time.

    ``rng`` is for tests. The default draws from the OS (``SystemRandom``): PySpark forks its Python
    workers from one daemon, and a seeded generator would hand every worker the same order.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.SystemRandom()

    def round(self, items: Sequence[T]) -> list[T]:
        out = list(items)
        if len(out) > 1:
            self._rng.shuffle(out)
        return out


ORDER = EndpointOrder()


def parse_endpoints(hosts: str, default_port: int) -> tuple[Endpoint, ...]:
    """``host1:5672,host2,[::1]:5673`` as endpoints; a host without a port gets ``default_port``.

    Raises ``ValueError`` saying what is wrong (never holding anything but the host list)."""
    endpoints: list[Endpoint] = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"an empty host in the host list '{hosts}'" if "," in hosts else "no host")
        endpoint = _one(item, default_port)
        if endpoint in endpoints:
            raise ValueError(f"{endpoint} is named twice in the host list '{hosts}'")
        endpoints.append(endpoint)
    return tuple(endpoints)


def _one(item: str, default_port: int) -> Endpoint:
    if item.startswith("["):
        inside, closed, after = item[1:].partition("]")
        if not closed:
            raise ValueError(f"'{item}' opens a '[' it never closes")
        # RFC 6874 writes a zone as %25 (``[fe80::1%25eth0]``); ipaddress takes it as '%'.
        host = urllib.parse.unquote(inside)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"'{item}': '{inside}' between brackets is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise ValueError(f"'{item}': after ']' comes ':port' or nothing")
        return Endpoint(host.lower(), _port(after[1:], item) if after else default_port)
    if item.count(":") > 1:
        raise ValueError(f"'{item}' looks like an IPv6 address: write it between brackets, e.g. [::1]:5672")
    host, has_port, port = item.partition(":")
    if not host:
        raise ValueError(f"'{item}' has no host before its port")
    if not _HOST_NAME.fullmatch(host):
        raise ValueError(f"'{host}' is not a host name or address")
    return Endpoint(host.lower(), _port(port, item) if has_port else default_port)


def _port(text: str, item: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"the port of '{item}' is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"the port of '{item}' is not between 1 and 65535")
    return port
