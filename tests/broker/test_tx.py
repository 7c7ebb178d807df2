"""Channel transactions: tx.select / tx.commit / tx.rollback, as RabbitMQ 3.10 runs them."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import closed_with, connect, drain, ready_count


def test_publishes_wait_for_commit_and_rollback_drops_them(amqp_url, ch, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    assert ready_count(amqp_url, q) == 0
    ch.tx_rollback()
    assert ready_count(amqp_url, q) == 0
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    assert ready_count(amqp_url, q) == 0
    ch.tx_commit()
    assert ready_count(amqp_url, q) == 2
    ch.tx_commit()  # an empty transaction commits too
    assert [b for _, _, b in drain(ch, q)] == [b"a", b"b"]


def test_acks_settle_at_commit_and_rollback_gives_the_tags_back(amqp_url, conn, ch, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.tx_select()
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(method.delivery_tag)  # the rollback gave the tag back: acking it again is fine
    ch.tx_commit()
    conn.close()  # nothing left unacked: nothing comes back
    assert ready_count(amqp_url, q) == 0


def test_a_rolled_back_ack_leaves_the_message_unacked(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.tx_select()
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    conn.close()  # still unacked: requeued
    assert ready_count(amqp_url, q) == 1


def test_unknown_tag_fails_at_the_ack_not_at_commit(ch) -> None:  # type: ignore[no-untyped-def]
    ch.tx_select()
    ch.basic_ack(999)
    assert closed_with(ch.tx_commit) == (406, "PRECONDITION_FAILED - unknown delivery tag 999")


def test_mandatory_unroutable_is_returned_at_commit(amqp_url) -> None:  # type: ignore[no-untyped-def]
    conn = connect(amqp_url)
    ch = conn.channel()
    returned: list[Any] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m.reply_code, b)))
    ch.tx_select()
    ch.basic_publish("amq.direct", "nobody-binds-this", b"r", mandatory=True)
    ch.tx_commit()
    conn.process_data_events(time_limit=0)
    conn.close()
    assert returned == [(312, b"r")]


def test_publish_to_a_missing_exchange_fails_before_commit(ch) -> None:  # type: ignore[no-untyped-def]
    ch.tx_select()
    ch.basic_publish("test.no.such.exchange", "k", b"x")
    code, text = closed_with(ch.tx_commit)
    assert (code, text) == (404, "NOT_FOUND - no exchange 'test.no.such.exchange' in vhost '/'")


@pytest.mark.parametrize(
    ("steps", "text"),
    [
        (("commit",), "PRECONDITION_FAILED - channel is not transactional"),
        (("rollback",), "PRECONDITION_FAILED - channel is not transactional"),
        (("confirm", "tx"), "PRECONDITION_FAILED - cannot switch from confirm to tx mode"),
        (("tx", "confirm"), "PRECONDITION_FAILED - cannot switch from tx to confirm mode"),
    ],
)
def test_mode_refusals(ch, steps, text) -> None:  # type: ignore[no-untyped-def]
    calls = {"commit": ch.tx_commit, "rollback": ch.tx_rollback, "confirm": ch.confirm_delivery, "tx": ch.tx_select}
    for step in steps[:-1]:
        calls[step]()
    assert closed_with(calls[steps[-1]]) == (406, text)


def test_select_twice_is_fine(ch) -> None:  # type: ignore[no-untyped-def]
    ch.tx_select()
    ch.tx_select()
    ch.tx_commit()
