"""channel.flow, connection.update-secret and how basic.qos scopes combine, as on RabbitMQ 3.10."""

from __future__ import annotations

import pika
import pytest

from .helpers import consume_n, wait_for
from .raw import C, StreamClient


def test_flow_off_is_refused_with_540_and_flow_on_is_acknowledged(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    assert ch.flow(True) is True
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.flow(False)
    assert (info.value.reply_code, info.value.reply_text) == (540, "NOT_IMPLEMENTED - active=false")


@pytest.mark.parametrize("secret", ["guest", "a-new-token"])
def test_update_secret_is_acknowledged(amqp_url, secret) -> None:  # type: ignore[no-untyped-def]
    raw = StreamClient(amqp_url)
    raw.send(0, C.Connection.UpdateSecret(new_secret=secret, reason="rotation"))
    raw.expect(C.Connection.UpdateSecretOk)
    raw.send(2, C.Channel.Open())  # the connection goes on
    raw.expect(C.Channel.OpenOk)
    raw.close()


def test_a_per_consumer_qos_lifts_the_channel_wide_limit(conn, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    ch.basic_qos(prefetch_count=10)
    got = consume_n(conn, ch, q, 5)
    assert len(got) == 5  # with the global limit of 1 still in force only one would come


def test_global_qos_alone_still_limits(conn, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=10)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got: list[int] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    wait_for(lambda: got or conn.process_data_events(time_limit=0.05))
    # A later get-less check: with one unacked, nothing more arrives before a synchronous round trip.
    ch.queue_declare(q, passive=True)
    conn.process_data_events(time_limit=0)
    assert len(got) == 1
