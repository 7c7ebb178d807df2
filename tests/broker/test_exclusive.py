"""Exclusive queues: who may use one, and what a redeclare must say.

RabbitMQ (3.10, 4.0 and 4.3 alike) checks a declare of an existing queue strictly: it must say
exclusive exactly when the queue is exclusive, and come from the connection that owns it, or the
channel is closed with 405 RESOURCE_LOCKED, before any other property is compared. Every other
use from another connection is 405 too, except unbinding a binding that is not there.
"""

from __future__ import annotations

import pytest

from .helpers import closed_with, connect

LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{}' in vhost '/'. It could be originally "
    "declared on another connection or the exclusive property value does not match that of the original declaration."
)


def _locked(queue: str, fn) -> None:  # type: ignore[no-untyped-def]
    assert closed_with(fn) == (405, LOCKED.format(queue))


def test_a_redeclare_on_the_owners_connection_must_say_exclusive(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q, shared = names.queue(), names.queue()
    owner = connect(amqp_url)
    try:
        owner.channel().queue_declare(q, exclusive=True, durable=True)
        owner.channel().queue_declare(shared, auto_delete=True)
        # Another channel of the same connection: what aiormq's test_exclusive_queue_locked does.
        _locked(q, lambda: owner.channel().queue_declare(q))
        _locked(q, lambda: owner.channel().queue_declare(q, durable=True))  # 405 first, not 406 for durable
        # An exclusive queue is transient whatever durable said: both redeclares are equivalent.
        owner.channel().queue_declare(q, exclusive=True)
        owner.channel().queue_declare(q, exclusive=True, durable=True)
        owner.channel().queue_declare(q, passive=True)
        _locked(shared, lambda: owner.channel().queue_declare(shared, exclusive=True, auto_delete=True))
        other = connect(amqp_url)
        _locked(shared, lambda: other.channel().queue_declare(shared, exclusive=True, auto_delete=True))
        other.close()
        inequivalent = closed_with(lambda: owner.channel().queue_declare(q, exclusive=True, auto_delete=True))
        assert inequivalent[0] == 406 and "inequivalent arg 'auto_delete'" in inequivalent[1]
    finally:
        owner.close()


def test_another_connection_may_not_use_an_exclusive_queue(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q, x = names.queue(), names.exchange()
    owner = connect(amqp_url)
    other = connect(amqp_url)
    try:
        ch = owner.channel()
        ch.queue_declare(q, exclusive=True)
        ch.exchange_declare(x, "fanout")
        ch.queue_bind(q, x, "bound")
        for use in (
            lambda c: c.queue_declare(q),
            lambda c: c.queue_declare(q, exclusive=True),
            lambda c: c.queue_declare(q, passive=True),
            lambda c: c.basic_consume(q, lambda *a: None),
            lambda c: c.basic_get(q),
            lambda c: c.queue_bind(q, x, "other"),
            lambda c: c.queue_unbind(q, x, "bound"),
            lambda c: c.queue_purge(q),
            lambda c: c.queue_delete(q),
        ):
            _locked(q, lambda use=use: use(other.channel()))
        other.channel().queue_unbind(q, x, "never-bound")  # nothing to take from the owner: fine
        publisher = other.channel()
        publisher.confirm_delivery()
        publisher.basic_publish(x, "", b"m")  # publishing to it is fine too
        assert owner.channel().queue_declare(q, passive=True).method.message_count == 1
    finally:
        other.close()
        owner.close()


@pytest.mark.parametrize(
    ("durable", "exclusive", "auto_delete", "refused"),
    [
        (False, False, False, "non-durable"),
        (False, False, True, "auto-delete"),
        (False, True, False, "exclusive-owner"),
        (False, True, True, "auto-delete"),
        (True, False, True, "auto-delete"),
        (True, True, False, "exclusive-owner"),
        (True, True, True, "auto-delete"),
    ],
)
def test_a_quorum_queues_properties_are_checked_in_rabbitmqs_order(ch, names, durable, exclusive, auto_delete, refused) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    code, text = closed_with(
        lambda: ch.queue_declare(q, durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments={"x-queue-type": "quorum"})
    )
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid property '{refused}' for queue '{q}' in vhost '/'")
