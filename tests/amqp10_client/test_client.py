"""The AMQP 1.0 client without Spark: on the embedded broker and RabbitMQ 4.x, links that publish and read with
outcomes and ranges of settlement; on RabbitMQ 3.10, which does not speak AMQP 1.0, a clear error at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pika
import pytest

from spark_amqp import amqp10
from spark_amqp.amqp10.performatives import Outcome, Performative
from spark_amqp.amqp10_client import Amqp10Client
from spark_amqp.client import AmqpClient
from spark_amqp.errors import AccessRefused, AmqpOptionError, HandshakeFailed, LoginRefused, NotFound
from spark_amqp.option_reader import OptionReader
from spark_amqp.transport.options import CONNECTION_KEYS, parse_connection
from tests.brokers import REAL

from ..broker.amqp10_helpers import publish, run, until
from ..broker.helpers import ready_count

AMQP10 = [b for b in REAL if b.version >= (4, 0)]


@pytest.fixture(params=["embedded", *(b.name for b in AMQP10)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "embedded":
        return str(request.getfixturevalue("shared_embedded").url)
    return next(b.url for b in AMQP10 if b.name == request.param)


@pytest.fixture
def queue(url: str) -> Iterator[str]:
    name = f"a10-{uuid.uuid4().hex[:10]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(name)
    conn.close()


async def _publish(client: Amqp10Client, address: str, messages: list[bytes]) -> list[int]:
    """Each message's outcome, by its descriptor code (0x24 accepted, 0x25 rejected, 0x26 released)."""
    return [code for code, _ in await publish(client, address, messages)]


def test_published_messages_are_accepted_and_read_back_in_order_with_their_properties(url: str, queue: str) -> None:
    n = 3000
    messages = [amqp10.encode(b"m%d" % i, properties=[f"id{i}"], application_properties={"n": i}) for i in range(n)]

    async def body(client: Amqp10Client) -> list[tuple[int, bytes]]:
        assert set(await _publish(client, f"/queues/{queue}", messages)) == {Performative.ACCEPTED}
        got: list[tuple[int, bytes]] = []
        receiver = await client.receiver(f"/queues/{queue}", lambda d, payload: got.append((d, payload)))
        receiver.grant(n)
        await until(lambda: len(got) == n)
        receiver.settle(got[0][0], got[-1][0])  # one disposition settles them all
        await receiver.detach()
        return got

    got = run(url, body)
    read = [amqp10.sections(payload) for _, payload in got]
    assert [s.body for s in read] == [b"m%d" % i for i in range(n)]
    assert [s.property("message_id") for s in read[:3]] == ["id0", "id1", "id2"] and read[7].application_properties == {"n": 7}
    assert [d for d, _ in got] == list(range(got[0][0], got[0][0] + n))  # delivery ids in order
    assert ready_count(url, queue) == 0


def test_released_messages_go_back_to_the_queue_and_unsettled_ones_on_detach(url: str, queue: str) -> None:
    async def body(client: Amqp10Client) -> None:
        await _publish(client, f"/queues/{queue}", [amqp10.encode(b"x%d" % i) for i in range(10)])
        got: list[int] = []
        receiver = await client.receiver(f"/queues/{queue}", lambda d, payload: got.append(d))
        receiver.grant(10)
        await until(lambda: len(got) == 10)
        receiver.settle(got[0], got[3], Outcome.RELEASED)  # 4 back now
        receiver.settle(got[4], got[6])  # 3 done
        await receiver.detach()  # 3 unsettled: back on detach

    run(url, body)
    deadline = time.monotonic() + 10
    while ready_count(url, queue) != 7:
        assert time.monotonic() < deadline, f"{ready_count(url, queue)} messages in the queue, not 7"
        time.sleep(0.05)


def test_credit_bounds_what_comes(url: str, queue: str) -> None:
    async def body(client: Amqp10Client) -> int:
        await _publish(client, f"/queues/{queue}", [amqp10.encode(b"c") for _ in range(50)])
        got: list[int] = []
        receiver = await client.receiver(f"/queues/{queue}", lambda d, payload: got.append(d))
        receiver.grant(7)
        await until(lambda: len(got) == 7)
        await asyncio.sleep(0.3)  # a window in which nothing more may come: the credit is spent
        count = len(got)
        receiver.settle(got[0], got[-1])
        await receiver.detach()
        return count

    assert run(url, body) == 7


def test_an_unroutable_message_is_released(url: str) -> None:
    async def body(client: Amqp10Client) -> list[int]:
        return await _publish(client, f"/exchanges/amq.direct/no-queue-{uuid.uuid4().hex}", [amqp10.encode(b"lost")])

    assert run(url, body) == [Performative.RELEASED]


def test_a_missing_queue_is_not_found(url: str) -> None:
    async def body(client: Amqp10Client) -> None:
        await client.receiver(f"/queues/missing-{uuid.uuid4().hex}", lambda d, payload: None)

    with pytest.raises(NotFound, match="amqp:not-found"):
        run(url, body)


def test_a_wrong_password_is_refused(url: str) -> None:
    with pytest.raises(AccessRefused, match="refused"):
        run(url, lambda c: asyncio.sleep(0), password="wrong")


def test_a_broker_without_amqp_1_0_is_a_clear_error_at_once() -> None:
    old = next((b.url for b in REAL if b.version < (4, 0)), None)
    if old is None:
        pytest.skip("no RabbitMQ 3.x in AMQP_TEST_BROKERS")
    started = time.monotonic()
    with pytest.raises(HandshakeFailed, match=r"answered the AMQP 1\.0 protocol header with AMQP 0-9-1's"):
        run(old, lambda c: asyncio.sleep(0))
    assert time.monotonic() - started < 5  # an answer, never a wait for connectionTimeout


def test_an_anonymous_login_over_either_protocol(url: str) -> None:
    """RabbitMQ 4 offers ANONYMOUS (as its anonymous_login_user, guest, from loopback); 3.10 does not: a clear refusal."""

    def bare(address: str) -> str:
        return address.partition("://")[0] + "://" + address.rpartition("@")[2]

    run(bare(url), lambda c: asyncio.sleep(0), authMechanism="ANONYMOUS")
    opts = parse_connection(OptionReader({"uri": bare(url), "authMechanism": "anonymous"}, CONNECTION_KEYS))
    assert (opts.mechanism, opts.username) == ("ANONYMOUS", "anonymous") and "guest" not in opts.display_uri

    async def over_0_9_1(address: str) -> None:
        client = await AmqpClient.connect(
            parse_connection(OptionReader({"uri": address, "authMechanism": "ANONYMOUS"}, CONNECTION_KEYS)), "t"
        )
        await client.close()

    asyncio.run(over_0_9_1(bare(url)))
    older = next((b.url for b in REAL if b.version < (4, 0)), None)
    if older is not None:
        with pytest.raises(LoginRefused, match="not ANONYMOUS"):
            asyncio.run(over_0_9_1(bare(older)))
    with pytest.raises(AmqpOptionError, match="authMechanism=ANONYMOUS logs in without credentials"):
        parse_connection(OptionReader({"uri": url, "authMechanism": "ANONYMOUS", "password": "x"}, CONNECTION_KEYS))
