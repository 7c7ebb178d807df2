"""Where a stream lives, and connections to the nodes that hold it.

RabbitMQ serves a stream-protocol subscription only on a node that holds a member of
the stream (elsewhere it answers ``0x06 stream not available``); ``metadata``, stats
and publishing work through any node (publishes are forwarded to the leader).
RabbitMQ's own stream clients ask ``metadata`` and connect to a replica, else the
leader, at the host and port that node advertises (``stream.advertised_host`` /
``stream.advertised_port``): so do readers here.

Behind a load balancer (or a NAT, or names the nodes do not advertise) the advertised
addresses cannot be reached: option ``loadBalancer`` then connects through the uri as
given, reads which node each connection reached from the broker's answer to ``open``,
and tries again until it is one that holds the stream, as the Java client does.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import AmqpSourceError, ConnectionLost, StreamResponseError
from ..transport.endpoints import Endpoint
from ..transport.options import ConnectionOptions
from .client import StreamClient
from .wire import OK, Key, strings

__all__ = [
    "STREAM_NOT_AVAILABLE",
    "Members",
    "connect_to_leader",
    "connect_to_leaders",
    "connect_to_member",
    "member_client",
    "members",
    "node_of",
]

log = logging.getLogger("spark_amqp.streams")

STREAM_NOT_AVAILABLE = 0x06
# Behind a load balancer, how many connections may land on other nodes before giving up. Each lands on a
# node at random, so the odds depend on the nodes behind the balancer, which the client cannot count: 5 per
# member missed a one-member stream behind 3 nodes once in 8 ((2/3)^5; the cluster test failed so here).
# 50 miss it with odds of 2e-9 behind 3 nodes and 5e-4 behind 7.
LOAD_BALANCER_TRIES = 50


@dataclass(frozen=True)
class Members:
    """A stream's response code in ``metadata``, and where its leader and replicas are."""

    code: int
    leader: Endpoint | None
    replicas: tuple[Endpoint, ...]

    @property
    def readers(self) -> tuple[Endpoint, ...]:
        """Where a reader goes: the replicas (RabbitMQ's clients spread readers over them), else the leader."""
        replicas = tuple(r for r in self.replicas if r != self.leader)
        return replicas or (() if self.leader is None else (self.leader,))

    @property
    def all(self) -> frozenset[Endpoint]:
        return frozenset(self.replicas) | ({self.leader} if self.leader is not None else frozenset())


def _node(host: str, port: int) -> Endpoint:
    return Endpoint(host.lower(), port)


async def members(client: StreamClient, *streams: str) -> dict[str, Members]:
    """Each stream's members, as ``metadata`` tells them (a stream that does not exist has a code other than OK)."""
    r = await client.request(Key.METADATA, strings(streams), "metadata")
    nodes = {}
    for _ in range(r.count()):
        ref, host, port = r.u16(), r.text(), r.u32()
        nodes[ref] = _node(host, port)
    out: dict[str, Members] = {}
    for _ in range(r.count()):
        name, code, leader = r.text(), r.u16(), r.u16()
        replicas = tuple(nodes[ref] for ref in [r.u16() for _ in range(r.count())] if ref in nodes)
        out[name] = Members(code, nodes.get(leader), replicas)
    return out


def node_of(client: StreamClient) -> Endpoint | None:
    """The node this connection reached, as it advertises itself (RabbitMQ 3.11+; None before)."""
    props = client.connection_properties
    host, port = props.get("advertised_host"), props.get("advertised_port")
    return _node(host, int(port)) if host and port and port.isdigit() else None


def _at(options: ConnectionOptions, nodes: tuple[Endpoint, ...]) -> ConnectionOptions:
    return dataclasses.replace(options, endpoints=nodes)


async def connect_to_member(options: ConnectionOptions, stream: str, client_name: str) -> StreamClient:
    """A connection to a node that holds a member of ``stream``: a replica if there is one, else the leader.

    The first connection goes where the uri says, and serves if it reached a reader's node. A stream
    that does not exist, or whose members are unknown (RabbitMQ 3.10 does not say which node a
    connection reached), is left to the caller's subscription to report."""
    first = await StreamClient.connect(options, client_name)
    found: Members | None = None
    try:
        found = (await members(first, stream)).get(stream)
        here = node_of(first)
        if found is None or found.code != OK or not found.all or here is None or here in found.readers:
            return first
        if options.load_balancer:
            return await _through_load_balancer(options, stream, client_name, found, first)
        chosen = await _direct(options, client_name, found, stream)
        if chosen is None:  # no replica answers: the leader serves all the same
            if here in found.all:
                return first
            assert found.leader is not None
            chosen = await StreamClient.connect(_at(options, (found.leader,)), client_name)
        await first.close()
        return chosen
    except ConnectionLost as err:
        first.abort(ConnectionLost("closed"))
        if found is None:
            raise  # the uri's own node went away: the caller's retry
        raise _unreachable(stream, found, err, options) from err
    except BaseException:
        first.abort(ConnectionLost("closed"))
        raise


async def _direct(options: ConnectionOptions, client_name: str, found: Members, stream: str) -> StreamClient | None:
    """A connection to one of the readers' nodes at its advertised address (the dial walks them); None if
    only the leader is left and none of the replicas answers."""
    replicas = tuple(r for r in found.readers if r != found.leader)
    if not replicas:
        return None
    try:
        return await StreamClient.connect(_at(options, replicas), client_name)
    except ConnectionLost as err:
        if found.leader is None:
            raise
        log.warning("AMQP source: no replica of stream '%s' answered (%s); reading from its leader", stream, err)
        return None


async def _through_load_balancer(
    options: ConnectionOptions, stream: str, client_name: str, found: Members, first: StreamClient
) -> StreamClient:
    """Connect through the uri again until the node reached is a replica of ``stream``; the leader will do if
    none comes within the tries."""
    tries = LOAD_BALANCER_TRIES
    leader: StreamClient | None = first if node_of(first) in found.all else None
    if leader is None:
        await first.close()
    try:
        for _ in range(tries):
            client = await StreamClient.connect(options, client_name)
            here = node_of(client)
            if here in found.readers:
                return client
            if here in found.all and leader is None:
                leader = client  # kept in case no replica comes
                continue
            await client.close()
    except BaseException:
        if leader is not None:
            leader.abort(ConnectionLost("closed"))
        raise
    if leader is not None:
        return leader
    raise AmqpSourceError(
        f"stream '{stream}': {tries} connections through {options.display_uri} reached none of the nodes that hold it "
        f"({', '.join(str(e) for e in sorted(found.all, key=str))}); check that the load balancer forwards to every node"
    )


async def connect_to_leader(options: ConnectionOptions, stream: str, client_name: str) -> StreamClient:
    """A connection to the node that leads ``stream``, for a publisher: any node takes publishes and forwards
    them to the leader, but at a cost (RabbitMQ 4.3.6, 3 nodes, 200k messages with confirms, our client:
    367k msg/s through the leader, 131k through another node). Any node will do where the leader cannot be
    reached."""
    first = await StreamClient.connect(options, client_name)
    try:
        found = (await members(first, stream)).get(stream)
        here = node_of(first)
        if found is None or found.code != OK or found.leader is None or here is None or here == found.leader:
            return first
        leader = await _leader(options, client_name, found)
        if leader is None:
            log.warning("AMQP sink: the leader of stream '%s' (%s) cannot be reached: publishing through %s", stream, found.leader, here)
            return first
        await first.close()
        return leader
    except BaseException:
        first.abort(ConnectionLost("closed"))
        raise


async def connect_to_leaders(first: StreamClient, streams: Sequence[str]) -> list[StreamClient]:
    """For each of ``streams`` (a super stream's partitions, which lead on several nodes), the connection to
    publish it on: one per leader node, ``first`` where it leads, where the leader is unknown or cannot be
    reached (any node forwards), and behind a load balancer (a connection per node would take many tries)."""
    here = node_of(first)
    if first.options.load_balancer or here is None:
        return [first] * len(streams)
    found = await members(first, *streams)
    by_node: dict[Endpoint, StreamClient] = {here: first}
    try:
        chosen = []
        for stream in streams:
            leader = found[stream].leader if stream in found and found[stream].code == OK else None
            if leader is not None and leader not in by_node:
                try:
                    by_node[leader] = await StreamClient.connect(_at(first.options, (leader,)), first.client_name)
                except ConnectionLost as err:
                    log.warning(
                        "AMQP sink: the leader of stream '%s' (%s) cannot be reached (%s): publishing through %s", stream, leader, err, here
                    )
                    by_node[leader] = first
            chosen.append(first if leader is None else by_node[leader])
        return chosen
    except BaseException:
        for client in by_node.values():
            if client is not first:
                client.abort(ConnectionLost("closed"))
        raise


async def _leader(options: ConnectionOptions, client_name: str, found: Members) -> StreamClient | None:
    assert found.leader is not None
    if not options.load_balancer:
        try:
            return await StreamClient.connect(_at(options, (found.leader,)), client_name)
        except ConnectionLost:
            return None
    for _ in range(LOAD_BALANCER_TRIES):
        client = await StreamClient.connect(options, client_name)
        if node_of(client) == found.leader:
            return client
        await client.close()
    return None


def _unreachable(stream: str, found: Members, err: BaseException, options: ConnectionOptions) -> ConnectionLost:
    """Transient (a failover moves members, nodes restart), but it says what to check if it lasts."""
    nodes = ", ".join(str(e) for e in sorted(found.all, key=str))
    return ConnectionLost(
        f"stream '{stream}' lives on {nodes} (as those nodes advertise themselves), and none could be reached ({err}). "
        f"If {options.display_uri} leads to a load balancer, or the nodes advertise addresses this machine cannot reach "
        "(stream.advertised_host), set option loadBalancer=true"
    )


# The connections a client opened to other nodes for questions its own node could not answer (0x06),
# by member; closed with it.
_SIDE: weakref.WeakKeyDictionary[StreamClient, dict[Endpoint, StreamClient]] = weakref.WeakKeyDictionary()


async def member_client(client: StreamClient, stream: str) -> StreamClient:
    """A connection to a node holding ``stream``, for a question ``client``'s node answered with 0x06 (it
    holds no member): one per member node, kept while ``client`` is open and closed with it."""
    found = (await members(client, stream)).get(stream)
    if found is not None and found.code != OK:
        raise StreamResponseError(found.code, f"stream '{stream}'")
    if found is None or not found.all:  # it exists, but no member runs now (a node drained or restarting)
        raise StreamResponseError(STREAM_NOT_AVAILABLE, f"stream '{stream}'")
    side = _SIDE.get(client)
    if side is None:
        side = _SIDE[client] = {}
        client.closed.add_done_callback(lambda _: _close_all(side))
    for node in found.all:
        kept = side.get(node)
        if kept is not None and not kept.closed.done():
            return kept
    made = await connect_to_member(client.options, stream, client.client_name + " (member)")
    side[node_of(made) or next(iter(found.readers))] = made
    return made


def _close_all(side: dict[Endpoint, StreamClient]) -> None:
    for kept in side.values():
        kept.abort(ConnectionLost("closed with the connection it served"))
    side.clear()
