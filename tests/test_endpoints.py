"""The endpoints of a uri without a broker: the order each connection tries them in, one round's walk
(on fake attempts), and which refusals move on to the next node and which end the walk."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from spark_amqp.errors import (
    AccessRefused,
    AllEndpointsFailed,
    AmqpProtocolError,
    ConnectionLost,
    HandshakeFailed,
    NotAllowed,
    PreconditionFailed,
    StreamResponseError,
    explain,
    is_transient,
    reply_error,
)
from spark_amqp.transport import endpoints
from spark_amqp.transport.dial import Failure, walk
from spark_amqp.transport.endpoints import Endpoint, EndpointOrder, parse_endpoints

ENDPOINTS = tuple(Endpoint("127.0.0.1", port) for port in (5701, 5702, 5703))


# -- the order -------------------------------------------------------------------------------------


def test_each_round_tries_every_endpoint_once() -> None:
    order = EndpointOrder()
    for _ in range(50):
        got = order.round(ENDPOINTS)
        assert sorted(got, key=lambda e: e.port) == list(ENDPOINTS)
    assert order.round(ENDPOINTS[:1]) == [ENDPOINTS[0]] and order.round(()) == []


def test_rounds_are_shuffled_afresh_and_spread_over_the_nodes() -> None:
    order = EndpointOrder(random.Random(7))
    firsts = Counter(order.round(ENDPOINTS)[0].port for _ in range(3000))
    assert set(firsts) == {5701, 5702, 5703}
    assert all(800 < n < 1200 for n in firsts.values()), firsts  # about a third each
    orders = {tuple(e.port for e in order.round(ENDPOINTS)) for _ in range(200)}
    assert len(orders) == 6  # every permutation of three comes up


def test_a_seeded_order_is_deterministic_and_leaves_the_list_alone() -> None:
    given = list(ENDPOINTS)
    one, two = EndpointOrder(random.Random(42)), EndpointOrder(random.Random(42))
    assert [one.round(given) for _ in range(5)] == [two.round(given) for _ in range(5)] and given == list(ENDPOINTS)


# -- parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "default", "expected"),
    [
        ("h1:5701,h2:5702,h3", 5672, [("h1", 5701), ("h2", 5702), ("h3", 5672)]),
        ("rabbit", 5671, [("rabbit", 5671)]),
        ("[::1]:5672,[::1]:5673", 5672, [("::1", 5672), ("::1", 5673)]),
        ("[2001:DB8::7],10.0.0.7:6000", 5552, [("2001:db8::7", 5552), ("10.0.0.7", 6000)]),
        ("[fe80::1%25eth0]:5672", 5672, [("fe80::1%eth0", 5672)]),
        (" Node-1.Rabbit.internal , node_2 ", 5672, [("node-1.rabbit.internal", 5672), ("node_2", 5672)]),
    ],
)
def test_host_lists(hosts: str, default: int, expected: list[tuple[str, int]]) -> None:
    assert parse_endpoints(hosts, default) == tuple(Endpoint(h, p) for h, p in expected)


def test_endpoints_show_as_written_in_a_uri() -> None:
    assert [str(e) for e in parse_endpoints("h1,[::1]:5673", 5672)] == ["h1:5672", "[::1]:5673"]


@pytest.mark.parametrize(
    ("hosts", "fragment"),
    [
        ("h1,,h2", "an empty host in the host list 'h1,,h2'"),
        ("h1,", "an empty host"),
        ("h1:0", "not between 1 and 65535"),
        ("h1:65536", "not between 1 and 65535"),
        ("h1:-5", "is not a number"),
        ("h1:x", "is not a number"),
        ("h1:", "is not a number"),
        (":5672", "has no host before its port"),
        ("::1", "between brackets"),
        ("::1:5672", "between brackets"),
        ("[::1", "never closes"),
        ("[::1]5672", "after ']' comes ':port'"),
        ("[rabbit]:5672", "is not an IPv6 address"),
        ("h 1", "is not a host name or address"),
        ("h1,h1:5672", "named twice"),
    ],
)
def test_bad_host_lists(hosts: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_endpoints(hosts, 5672)
    assert fragment in str(info.value)


# -- one round's walk, on fake attempts ----------------------------------------------------------------


def _run_walk(
    outcomes: dict[str, object], addresses: dict[str, list[str]] | None = None, last: str | None = None
) -> tuple[object, list[str]]:
    """One walk with a canned outcome (an error or a connection) per address; (what it gave, addresses tried).
    ``addresses``: each host's (none: its name does not resolve); by default each host of ``outcomes`` is its own."""
    hosts = addresses if addresses is not None else {h: [h] for h in outcomes}
    tried: list[str] = []

    async def resolve(endpoint: Endpoint) -> list[tuple[str, str]] | Failure:
        found = hosts[endpoint.host]
        if not found:
            return Failure(str(endpoint), "its name did not resolve", ConnectionLost(f"cannot connect to {endpoint}"))
        return [(a, str(endpoint) if a == endpoint.host else f"{endpoint} at {a}") for a in found]

    async def attempt(endpoint: Endpoint, address: str, where: str) -> object:
        tried.append(address)
        outcome = outcomes[address]
        return Failure(where, str(outcome), outcome) if isinstance(outcome, AmqpProtocolError) else outcome

    try:
        result: object = asyncio.run(
            walk([Endpoint(h, 5672) for h in hosts], resolve, attempt, Endpoint(last, 5672) if last is not None else None)
        )
    except AmqpProtocolError as err:
        result = err
    return result, tried


def test_transient_failures_move_on_to_the_next_endpoint(listed: None) -> None:
    result, tried = _run_walk(
        {
            "a": ConnectionLost("cannot connect to a:5672: connection refused"),
            "b": reply_error(320, "CONNECTION_FORCED - shutdown", on_connection=True),
            "c": "connected to c",
        }
    )
    assert result == "connected to c" and tried == ["a", "b", "c"]


@pytest.mark.parametrize(
    "permanent",
    [
        reply_error(403, "ACCESS_REFUSED - Login was refused", 10, 40, on_connection=True),
        reply_error(530, "NOT_ALLOWED - vhost nope not found", 10, 40, on_connection=True),
        HandshakeFailed("TLS: the certificate of b:5672 failed verification"),
        HandshakeFailed("the broker does not speak AMQP 0-9-1"),
    ],
)
def test_a_permanent_refusal_ends_the_walk_at_once(listed: None, permanent: AmqpProtocolError) -> None:
    result, tried = _run_walk({"a": ConnectionLost("refused"), "b": permanent, "c": "connected to c"})
    assert result is permanent and tried == ["a", "b"]


def test_when_every_endpoint_fails_the_error_names_each_and_its_reason(listed: None) -> None:
    result, tried = _run_walk(
        {
            "a": ConnectionLost("cannot connect to a:5672: connection refused"),
            "b": ConnectionLost("no answer from b:5672 within connectionTimeout=5s"),
        }
    )
    assert isinstance(result, AllEndpointsFailed) and is_transient(result) and tried == ["a", "b"]
    assert str(result) == (
        "cannot connect to any of a:5672 (cannot connect to a:5672: connection refused), "
        "b:5672 (no answer from b:5672 within connectionTimeout=5s)"
    )
    assert result.failures[0][0] == "a:5672" and isinstance(result.__cause__, ConnectionLost)


def test_one_endpoint_raises_its_own_error_as_before(listed: None) -> None:
    only = ConnectionLost("cannot connect to a:5672: connection refused")
    result, _ = _run_walk({"a": only})
    assert result is only


def test_a_name_with_several_addresses_tries_each_in_the_same_walk(listed: None) -> None:
    result, tried = _run_walk(
        {"10.0.0.1": ConnectionLost("refused"), "10.0.0.2": ConnectionLost("reset"), "10.0.0.3": "connected"},
        addresses={"gone": [], "rabbit": ["10.0.0.1", "10.0.0.2", "10.0.0.3"]},
    )
    assert result == "connected" and tried == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    result, _ = _run_walk(
        {"10.0.0.1": ConnectionLost("refused"), "10.0.0.2": ConnectionLost("reset")},
        addresses={"gone": [], "rabbit": ["10.0.0.1", "10.0.0.2"]},
    )
    assert str(result) == (
        "cannot connect to any of gone:5672 (its name did not resolve), rabbit:5672 at 10.0.0.1 (refused), rabbit:5672 at 10.0.0.2 (reset)"
    )


def test_the_walk_follows_the_shuffled_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "ORDER", EndpointOrder(random.Random(3)))
    expected = [e.host for e in EndpointOrder(random.Random(3)).round([Endpoint(h, 5672) for h in "abc"])]
    _, tried = _run_walk({h: ConnectionLost("refused") for h in "abc"})
    assert tried == expected


# -- which refusals are transient ----------------------------------------------------------------------

NO_REPLICA = "PRECONDITION_FAILED - stream queue 'events' in vhost '/' does not have a running replica on the local node"


@pytest.mark.parametrize(
    ("err", "transient"),
    [
        (reply_error(406, NO_REPLICA, 60, 20), True),  # basic.consume after a leader failover
        (reply_error(406, NO_REPLICA, 50, 10), True),  # the passive queue.declare of latestOffset
        (reply_error(406, "PRECONDITION_FAILED - consumer ack timed out on channel 1", 0, 0), True),
        (reply_error(406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q'", 50, 10), False),
        (reply_error(406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset'", 60, 20), False),
        (StreamResponseError(0x06, "stream 'events'"), True),
        (StreamResponseError(0x02, "stream 'events'"), False),
        (reply_error(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", on_connection=True), True),
        (reply_error(403, "ACCESS_REFUSED - Login was refused", 10, 40, on_connection=True), False),
        (reply_error(530, "NOT_ALLOWED - vhost nope not found", 10, 40, on_connection=True), False),
        (AllEndpointsFailed((("a:5672", "connection refused"),)), True),
    ],
)
def test_transient_or_permanent(err: AmqpProtocolError, transient: bool) -> None:
    assert is_transient(err) is transient


def test_the_no_replica_refusal_is_explained_as_a_node_without_the_stream() -> None:
    err = reply_error(406, NO_REPLICA, 50, 10)
    assert isinstance(err, PreconditionFailed) and err.no_local_replica
    said = explain(err, "amqp://etl@h1:5672,h2:5672/%2F", "etl", "/", "stream 'events'")
    assert "has no running replica of the stream" in said and "other properties" not in said
    assert isinstance(reply_error(403, "x", on_connection=True), AccessRefused)
    assert isinstance(reply_error(530, "x", on_connection=True), NotAllowed)


def test_the_endpoint_that_let_its_client_down_is_tried_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sink connects again after a node stopped confirming (cut off from its cluster, still answering): a
    # shuffled walk would pick that node again one time in three.
    for seed in range(20):
        monkeypatch.setattr(endpoints, "ORDER", EndpointOrder(random.Random(seed)))
        _, tried = _run_walk({h: ConnectionLost("refused") for h in "abc"}, last="b")
        assert sorted(tried) == ["a", "b", "c"] and tried[-1] == "b"
        result, tried = _run_walk({"a": "connected to a", "b": "connected to b", "c": "connected to c"}, last="b")
        assert result != "connected to b" and len(tried) == 1
