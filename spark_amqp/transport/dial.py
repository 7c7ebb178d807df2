"""Opening a connection: a walk over the uri's endpoints, each host's addresses in turn, until one answers.

Both clients (AMQP 0-9-1 and the stream protocol) open through ``open_within_timeout``. One call
is one round: the endpoints in a fresh random order (``endpoints.ORDER``), each host resolved
when its turn comes, each address given ``connectionTimeout``. A transient failure (refused,
reset, no answer, closed during the handshake, ``320 CONNECTION_FORCED`` from a node that is
shutting down or draining) moves on to the next address at once; a permanent one (a refused login,
a missing vhost, TLS (``tls.py``), a peer that is not a broker) is the same on every node and ends the walk.
When every address failed, the round fails with each one's reason. The callers' own retry loops
back off between rounds: there is no waiting here.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from ..errors import AllEndpointsFailed, AmqpProtocolError, ConnectionLost, is_transient
from . import endpoints as endpoint_order
from .endpoints import Endpoint
from .options import ConnectionOptions
from .tls import handshake_failure, tls_context

__all__ = ["Failure", "open_within_timeout", "tls_context", "walk"]


class _Abortable(Protocol):
    endpoint: Endpoint | None

    def abort(self, reason: AmqpProtocolError) -> None: ...


P = TypeVar("P", bound=_Abortable)
C = TypeVar("C")


@dataclass(frozen=True)
class Failure:
    """One address that did not give a connection."""

    where: str  # "127.0.0.1:5701", or "rabbit.internal:5672 at 10.0.0.7" for one address of a name
    reason: str  # short, for the list of a whole round: "connection refused"
    error: AmqpProtocolError  # what a uri of one address raises as it is


async def open_within_timeout(
    options: ConnectionOptions, make: Callable[[], P], opened: Callable[[P], Awaitable[None]], last: Endpoint | None = None
) -> P:
    """A connection made by ``make`` and ready once ``opened`` returns, to the first endpoint that gives one (its
    ``endpoint`` says which; ``last`` is tried after the others).

    Every way it can fail is one ``AmqpProtocolError``, and a half-open (perhaps logged-in)
    connection never outlives its attempt."""
    ctx = tls_context(options)  # an option error, the same for every endpoint: before any of them
    timeout = options.connection_timeout

    async def resolve(endpoint: Endpoint) -> list[tuple[str, str]] | Failure:
        return await _resolve(endpoint, timeout)

    async def attempt(endpoint: Endpoint, address: str, where: str) -> P | Failure:
        outcome = await _open_one(endpoint, address, where, timeout, ctx, options, make, opened)
        if not isinstance(outcome, Failure):
            outcome.endpoint = endpoint
        return outcome

    return await walk(options.endpoints, resolve, attempt, last)


async def walk(
    endpoints: Sequence[Endpoint],
    resolve: Callable[[Endpoint], Awaitable[list[tuple[str, str]] | Failure]],
    attempt: Callable[[Endpoint, str, str], Awaitable[C | Failure]],
    last: Endpoint | None = None,
) -> C:
    """One round: each endpoint's addresses (``resolve``: (address, where) pairs) tried with ``attempt``
    until one gives a connection, ``last`` (one that let its client down) after the others. A permanent
    failure is raised at once; when all failed, a uri of one address raises that address's error as it
    is, a longer one ``AllEndpointsFailed``."""
    order = endpoint_order.ORDER  # looked up now: a test may put an order of its own in place
    failures: list[Failure] = []
    walk_order = order.round(endpoints)
    if last in walk_order:
        walk_order.remove(last)
        walk_order.append(last)
    for endpoint in walk_order:
        addresses = await resolve(endpoint)
        if isinstance(addresses, Failure):
            failures.append(addresses)
            continue
        for address, where in order.round(addresses):
            outcome = await attempt(endpoint, address, where)
            if not isinstance(outcome, Failure):
                return outcome
            if not is_transient(outcome.error):
                raise outcome.error
            failures.append(outcome)
    if len(failures) == 1:
        raise failures[0].error
    raise AllEndpointsFailed(tuple((f.where, f.reason) for f in failures)) from failures[-1].error


async def _resolve(endpoint: Endpoint, timeout: float) -> list[tuple[str, str]] | Failure:
    """The addresses of ``endpoint`` (one for an IP address), each with how errors name it."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM), timeout)
    except TimeoutError:
        reason = f"its name did not resolve within connectionTimeout={timeout:g}s"
        return Failure(str(endpoint), reason, ConnectionLost(f"cannot connect to {endpoint}: {reason}"))
    except OSError as err:  # the resolver is down, or the name unknown (a typo fails every round the same way)
        reason = _os_reason(err)
        return Failure(str(endpoint), reason, ConnectionLost(f"cannot connect to {endpoint}: {reason}"))
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if addresses == [endpoint.host]:
        return [(endpoint.host, str(endpoint))]
    return [(a, f"{endpoint} at {a}") for a in addresses]


async def _open_one(
    endpoint: Endpoint,
    address: str,
    where: str,
    timeout: float,
    ctx: ssl.SSLContext | None,
    options: ConnectionOptions,
    make: Callable[[], P],
    opened: Callable[[P], Awaitable[None]],
) -> P | Failure:
    loop = asyncio.get_running_loop()
    made: list[P] = []

    def factory() -> P:
        made.append(make())
        return made[0]

    async def open_connection() -> None:
        protocol_factory = cast(Callable[[], asyncio.Protocol], factory)  # P is an asyncio.Protocol with abort()
        # TLS checks the certificate against the host's name (or tls.serverName), not against the address it resolved to.
        hostname = ((options.tls.server_name if options.tls else None) or endpoint.host) if ctx else None
        await loop.create_connection(protocol_factory, address, endpoint.port, ssl=ctx, server_hostname=hostname)
        await opened(made[0])

    try:
        await asyncio.wait_for(open_connection(), timeout)
    except TimeoutError:
        reason = f"no answer within connectionTimeout={timeout:g}s"
        failure = Failure(where, reason, ConnectionLost(f"no answer from {where} within connectionTimeout={timeout:g}s"))
    except ssl.SSLError as tls_err:
        error = handshake_failure(where, tls_err, options.tls)
        failure = Failure(where, str(error), error)
    except AmqpProtocolError as protocol_err:
        failure = Failure(where, str(protocol_err), protocol_err)
    except OSError as os_err:
        reason = _os_reason(os_err)
        failure = Failure(where, reason, ConnectionLost(f"cannot connect to {where}: {reason}"))
    except BaseException:  # cancelled: the half-open connection goes with the attempt
        if made:
            made[0].abort(ConnectionLost("connecting was cancelled"))
        raise
    else:
        return made[0]
    if made:
        made[0].abort(failure.error)
    return failure


def _os_reason(err: OSError) -> str:
    """``connection refused``, not asyncio's ``Connect call failed ('127.0.0.1', 5672)``."""
    if isinstance(err, socket.gaierror):
        return f"its name did not resolve ({err.strerror or err})"
    if err.errno:
        return os.strerror(err.errno).lower()
    return str(err) or type(err).__name__
