"""``ChannelPolicy`` on its own: what a refused ``basic.consume`` means, worded from the broker's reply."""

from __future__ import annotations

from spark_amqp.errors import AccessRefused
from spark_amqp.queues.channel_policy import ChannelPolicy
from spark_amqp.queues.options import parse_source_options

CONSUME = (60, 20)


def _policy() -> ChannelPolicy:
    policy = ChannelPolicy(parse_source_options({"uri": "amqp://etl@rabbit/prod", "queue": "q", "journalLocation": "/tmp/j"}))
    policy.subscribed("q")  # a refusal right after a reconnect is the case that used to be retried
    return policy


def test_a_revoked_read_permission_is_not_called_an_exclusivity_conflict() -> None:
    refusal = AccessRefused("ACCESS_REFUSED - access to queue 'q' in vhost 'prod' refused for user 'etl'", *CONSUME)
    message = _policy().failure("q", refusal)
    assert message is not None, "retried as if our previous consumer still held the queue"
    assert "exclusive" not in message and "user 'etl' is not allowed" in message and "permissions" in message


def test_an_exclusive_consumer_of_ours_after_a_reconnect_is_waited_for() -> None:
    refusal = AccessRefused("ACCESS_REFUSED - queue 'q' in vhost 'prod' in exclusive use", *CONSUME)
    assert _policy().failure("q", refusal) is None


def test_a_queue_found_shared_is_warned_about_once_per_count(caplog) -> None:  # type: ignore[no-untyped-def]
    policy = _policy()
    with caplog.at_level("WARNING", logger="spark_amqp.queues"):
        for consumers in (1, 2, 2, 3, 1, 2):
            policy.counted("q", consumers)
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "AMQP source: queue 'q' has 2 consumers",
        "AMQP source: queue 'q' has 3 consumers",
        "AMQP source: queue 'q' has 2 consumers",
    ]
    shared_ok = ChannelPolicy(parse_source_options({"uri": "amqp://etl@rabbit/prod", "queue": "q", "exclusiveConsumer": "false"}))
    caplog.clear()
    shared_ok.counted("q", 5)
    assert not caplog.records  # a query that shares its queue on purpose
