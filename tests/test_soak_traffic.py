"""The soak's producer (``soak/traffic.py``), on the embedded broker: a publish whose confirm does not come is given up
on after its timeout, and its id sent again on a new connection, counted as possibly doubled. (A partitioned node
answers heartbeats and confirms nothing: the soak of 2026-11-28 had its producer wait there for 46 minutes.)"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from spark_amqp_broker import EmbeddedBroker

from .broker.helpers import ready_count, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))
import traffic


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as found:
        conn = pika.BlockingConnection(pika.URLParameters(found.url))
        conn.channel().queue_declare("soak-q", durable=True)
        conn.close()
        yield found


def test_a_confirm_that_never_comes_drops_the_connection_and_the_id_is_sent_again(broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(traffic, "CONFIRM_TIMEOUT", 1.0)
    monkeypatch.setattr(traffic, "RECONNECT_PAUSE", 0.1)
    producer = traffic.Producer([broker.url], "soak-q", "q", rate=50)
    producer.start()
    try:
        assert wait_for(lambda: len(producer.confirmed) >= 5, timeout=30)
        broker.hold_confirms()
        assert wait_for(lambda: producer.errors["ConfirmTimeout"] >= 1, timeout=30), dict(producer.errors)
        held = len(producer.confirmed)
        broker.release_confirms()
        assert wait_for(lambda: len(producer.confirmed) >= held + 5, timeout=30)
    finally:
        producer.stopping.set()
        producer.join(30)
    assert not producer.is_alive()
    # The id whose confirm never came is the one sent again, and it is confirmed now.
    first_resent = min(producer.resent, key=lambda i: int(i[1:]))
    assert first_resent == f"q{held}" and first_resent in producer.confirmed, (sorted(producer.resent), held)
    # Every confirmed id is in the queue; those sent twice may be there twice.
    assert ready_count(broker.url, "soak-q") >= len(producer.confirmed)
