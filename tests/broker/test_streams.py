"""Stream queues (x-queue-type: stream) over AMQP 0-9-1, as RabbitMQ serves them.

Every test runs on the embedded broker (which behaves as the newest 4.x line) and on
every RabbitMQ in AMQP_TEST_BROKERS: the texts and codes asserted here are RabbitMQ's
own, and where 3.10 and 4.x differ each test says what each line does.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pika
import pytest

from .helpers import connect, ready_count, wait_for
from .raw import StreamClient

STREAM = {"x-queue-type": "stream"}
SMALL_SEGMENTS = {"x-stream-max-segment-size-bytes": 1000}  # about four 100-byte messages per segment, on both brokers


def _declare(url: str, name: str, **args: Any) -> None:
    conn = connect(url)
    conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **args})
    conn.close()


def _publish_each(url: str, name: str, bodies: list[bytes], **props: Any) -> None:
    """One confirmed publish at a time: each message is a chunk of its own on both brokers."""
    conn = connect(url)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(**props))
    conn.close()


def _read(url: str, name: str, offset: Any, prefetch: int = 1000, want: int | None = None) -> list[tuple[int, bytes]]:
    """(offset, body) of what a consumer starting at ``offset`` gets: ``want`` deliveries, or
    everything sent before the cancel-ok when ``want`` is None."""
    if want is None:
        raw = StreamClient(url)
        try:
            return [(o, b"") for o, _ in raw.consume_then_cancel(name, offset, prefetch)]
        finally:
            raw.close()
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[int, bytes]] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append((p.headers["x-stream-offset"], b)), arguments={"x-stream-offset": offset})
    wait_for(lambda: len(got) >= want or conn.process_data_events(time_limit=0.05), timeout=15)
    conn.close()
    return got


def _offsets(url: str, name: str, offset: Any, prefetch: int = 1000) -> list[int]:
    return [o for o, _ in _read(url, name, offset, prefetch)]


def _channel_refusal(url: str, fn) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    conn = connect(url)
    ch = conn.channel()
    with pytest.raises((pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)) as info:
        fn(ch)
    if conn.is_open:
        conn.close()
    return info.value.args[0], info.value.args[1]


# -- declaring ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("durable", "exclusive", "auto_delete", "prop"),
    [
        (False, False, False, "non-durable"),
        (True, True, False, "exclusive-owner"),
        (True, False, True, "auto-delete"),
        (False, True, False, "exclusive-owner"),
        (False, True, True, "auto-delete"),
    ],
)
def test_stream_must_be_durable_and_shared(amqp_url, names, durable, exclusive, auto_delete, prop) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    code, text = _channel_refusal(
        amqp_url, lambda ch: ch.queue_declare(q, durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments=STREAM)
    )
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{q}' in vhost '/'")


@pytest.mark.parametrize(
    ("args", "code", "tail"),
    [
        ({"x-max-length": 10}, 406, " of queue type rabbit_stream_queue"),
        ({"x-message-ttl": 10}, 406, " of queue type rabbit_stream_queue"),
        ({"x-dead-letter-exchange": "x"}, 406, " of queue type rabbit_stream_queue"),
        ({"x-max-age": "10x"}, 406, ": invalid_max_age"),
        ({"x-max-age": "0s"}, 406, ": invalid_max_age"),
        ({"x-max-age": 10}, 406, ": {unacceptable_type,signedint}"),
        ({"x-max-length-bytes": -1}, 406, ": {value_negative,-1}"),
        ({"x-max-length-bytes": "10"}, 406, ': "expected integer, got longstr"'),
        ({"x-max-age": "bogus"}, 541, ""),
    ],
)
def test_stream_arguments_refused_as_rabbitmq_does(amqp_url, names, broker_version, args, code, tail) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    got_code, text = _channel_refusal(amqp_url, lambda ch: ch.queue_declare(q, durable=True, arguments={**STREAM, **args}))
    if code == 541 and broker_version >= (4, 3):  # 3.10 and 4.0 crash parsing an age without digits; 4.3 refuses it
        code, tail = 406, ": invalid_max_age"
    assert got_code == code
    if code == 541:
        assert text == "INTERNAL_ERROR"
    else:
        assert text == f"PRECONDITION_FAILED - invalid arg '{next(iter(args))}' for queue '{q}' in vhost '/'{tail}"


def test_stream_declare_accepts_retention_and_refuses_server_named_and_inequivalent(amqp_url, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    q, limited = names.queue("stream"), names.queue("stream")
    _declare(amqp_url, q)
    _declare(amqp_url, q)  # an equivalent redeclare is fine
    _declare(amqp_url, limited, **{"x-max-age": "1m", "x-max-length-bytes": 10_000_000, **SMALL_SEGMENTS})
    code, text = _channel_refusal(amqp_url, lambda ch: ch.queue_declare("", durable=True, arguments=STREAM))
    assert (code, text) == (406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")
    code, text = _channel_refusal(amqp_url, lambda ch: ch.queue_declare(q, durable=True))
    assert code == 406
    if broker_version >= (4, 0):  # 4.x names the queue types
        why = "received 'classic' but current is 'stream'"
    else:
        why = "received none but current is the value 'stream' of type 'longstr'"
    assert text == f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{q}' in vhost '/': {why}"
    code, text = _channel_refusal(amqp_url, lambda ch: ch.queue_declare(limited, durable=True))
    assert code == 406  # RabbitMQ compares x-max-length-bytes before x-queue-type
    assert (
        text
        == f"PRECONDITION_FAILED - inequivalent arg 'x-max-length-bytes' for queue '{limited}' in vhost '/': received none but current is the value '10000000' of type 'signedint'"
    )


# -- where a consumer starts --------------------------------------------------


def test_first_last_next_and_numbers(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"m%d" % i for i in range(10)])
    assert _offsets(amqp_url, q, "first") == list(range(10))
    assert _offsets(amqp_url, q, "last") == [9]  # the last chunk, here one message
    assert _offsets(amqp_url, q, 5) == [5, 6, 7, 8, 9]
    assert _offsets(amqp_url, q, -1) == list(range(10))  # before the head: from the first offset kept
    assert _offsets(amqp_url, q, "next") == []
    assert [o for o, _ in _read(amqp_url, q, b"first", want=10)] == list(range(10))  # a byte array is read as a string
    assert _read(amqp_url, q, 7, want=3) == [(7, b"m7"), (8, b"m8"), (9, b"m9")]


def test_next_and_beyond_the_end_wait_for_new_messages(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"a", b"b", b"c"])
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: dict[str, list[int]] = {"next": [], "far": [], "exact": []}
    for key, offset in (("next", "next"), ("far", 100), ("exact", 4)):
        ch.basic_consume(q, lambda c, m, p, b, k=key: got[k].append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": offset})
    _publish_each(amqp_url, q, [b"d", b"e"])
    wait_for(lambda: (len(got["next"]) >= 2 and len(got["exact"]) >= 1) or conn.process_data_events(time_limit=0.05), timeout=15)
    for tag in list(ch.consumer_tags):
        ch.basic_cancel(tag)  # deliveries sent before cancel-ok arrive before it
    conn.close()
    assert got["next"] == [3, 4]
    assert got["exact"] == [4]
    assert got["far"] == []  # an offset past the end waits for that offset, not for the next message


def test_last_on_an_empty_stream_starts_at_the_first_message_written(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: dict[str, list[int]] = {"last": [], "timestamp": []}
    ch.basic_consume(q, lambda c, m, p, b: got["last"].append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": "last"})
    stamp = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    ch.basic_consume(q, lambda c, m, p, b: got["timestamp"].append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": stamp})
    _publish_each(amqp_url, q, [b"a", b"b"])
    wait_for(lambda: (len(got["last"]) >= 2 and len(got["timestamp"]) >= 2) or conn.process_data_events(time_limit=0.05), timeout=15)
    ch.basic_ack(0, multiple=True)
    conn.close()
    assert got == {"last": [0, 1], "timestamp": [0, 1]}


def test_timestamps_choose_the_first_chunk_written_at_or_after(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"early0", b"early1"])
    boundary = int(time.time()) + 1  # chunk timestamps are ms; the argument is whole seconds
    wait_for(lambda: time.time() >= boundary + 0.05, timeout=5)
    _publish_each(amqp_url, q, [b"late0", b"late1"])
    at = datetime.datetime.fromtimestamp(boundary, tz=datetime.UTC)
    assert _offsets(amqp_url, q, at) == [2, 3]
    assert _offsets(amqp_url, q, at - datetime.timedelta(days=1)) == [0, 1, 2, 3]
    assert _offsets(amqp_url, q, at + datetime.timedelta(days=1)) == []
    assert _offsets(amqp_url, q, "1m") == [0, 1, 2, 3]  # an age: what was written in the last minute


def test_every_delivery_carries_its_offset_as_a_long_header(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(
        amqp_url, q, [b"x"], headers={"z": 1, "x-stream-offset": 77, "a": 2}, message_id="id", delivery_mode=2, content_type="text/plain"
    )
    _publish_each(amqp_url, q, [b"y"])
    raw = StreamClient(amqp_url)
    got = raw.consume_then_cancel(q, "first", 10)
    raw.close()
    assert [o for o, _ in got] == [0, 1]
    for offset, header in got:
        assert b"\x0fx-stream-offsetl" + offset.to_bytes(8, "big") in header  # type 'l': a signed 64-bit long
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    seen: list[tuple[Any, Any]] = []
    ch.basic_consume(q, lambda c, m, p, b: seen.append((m, p)), arguments={"x-stream-offset": 0})
    wait_for(lambda: len(seen) >= 2 or conn.process_data_events(time_limit=0.05), timeout=15)
    conn.close()
    (m0, p0), (_, p1) = seen
    assert list(p0.headers.items()) == [("a", 2), ("x-stream-offset", 0), ("z", 1)]  # replaced; keys come back sorted
    assert (p0.message_id, p0.delivery_mode, p0.content_type) == ("id", 2, "text/plain")
    assert p1.headers == {"x-stream-offset": 1}
    assert not m0.redelivered and m0.routing_key == q and m0.exchange == ""


# -- chunks, credit and acks ----------------------------------------------------


def test_chunks_and_the_prefetch(amqp_url, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    # "last" is the last chunk: all of it for a consumer with credit enough. A burst makes
    # chunks of many messages, so this one starts well before the end; on a loaded machine the
    # burst's last write can still hold a single message, so burst again until it does not.
    total, last = 0, []
    for _ in range(5):
        raw = StreamClient(amqp_url)
        raw.publish_burst(q, [b"x" * 200] * 2000)
        raw.close()
        total += 2000
        last = _offsets(amqp_url, q, "last", prefetch=5000)
        if len(last) > 1:
            break
    assert len(last) > 1 and last == list(range(last[0], total))
    if broker_version < (4, 0):
        # 3.10 sends a chunk whole whatever the prefetch: walk the stream chunk by chunk.
        sizes, offset = [], 0
        while offset < total:
            got = _offsets(amqp_url, q, offset, prefetch=1)
            assert got and got[0] == offset and got == list(range(offset, offset + len(got))), (offset, sizes, got[:3])
            sizes.append(len(got))
            offset = got[-1] + 1
        assert sum(sizes) == total and sizes[-1] == len(last)
        # Inside a chunk, delivery starts at the offset asked for, not at the chunk's start.
        start = sum(sizes[: sizes.index(max(sizes))])
        assert _offsets(amqp_url, q, start + 1, prefetch=1) == list(range(start + 1, start + max(sizes)))
    else:
        # 4.x stops at the prefetch inside a chunk, wherever the consumer starts.
        assert _offsets(amqp_url, q, "last", prefetch=1) == last[:1]
        assert _offsets(amqp_url, q, last[0] + 1, prefetch=3) == last[1:4]


def test_acks_only_give_credit_and_nothing_is_deleted(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"m%d" % i for i in range(6)])
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    got: list[Any] = []
    ch.basic_consume(
        q, lambda c, m, p, b: got.append((m.delivery_tag, p.headers["x-stream-offset"])), arguments={"x-stream-offset": "first"}
    )
    wait_for(lambda: len(got) >= 2 or conn.process_data_events(time_limit=0.05), timeout=15)
    assert [o for _, o in got] == [0, 1]
    ch.basic_ack(got[1][0], multiple=True)
    wait_for(lambda: len(got) >= 4 or conn.process_data_events(time_limit=0.05), timeout=15)
    assert [o for _, o in got] == [0, 1, 2, 3]
    ch.basic_ack(got[3][0], multiple=True)
    wait_for(lambda: len(got) >= 6 or conn.process_data_events(time_limit=0.05), timeout=15)
    ch.basic_ack(got[5][0], multiple=True)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 0  # RabbitMQ 3.10 does not count stream consumers
    conn.close()
    assert _offsets(amqp_url, q, "first") == list(range(6))  # acked, and still there
    # message_count is next offset minus first offset; RabbitMQ's lags by a few seconds.
    wait_for(lambda: ready_count(amqp_url, q) == 6, timeout=20, interval=0.25)


def test_unacked_deliveries_of_a_closed_channel_are_not_redelivered(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"a", b"b"])
    assert len(_read(amqp_url, q, "first", want=2)) == 2  # left unacked, connection closed
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    seen: list[bool] = []
    ch.basic_consume(q, lambda c, m, p, b: seen.append(m.redelivered), arguments={"x-stream-offset": "first"})
    wait_for(lambda: len(seen) >= 2 or conn.process_data_events(time_limit=0.05), timeout=15)
    conn.close()
    assert seen == [False, False]


# -- refusals -----------------------------------------------------------------------


def _consume(q: str, prefetch: int | None = 10, global_prefetch: int | None = None, offset: Any = "first", **kwargs: Any):  # type: ignore[no-untyped-def]
    def run(ch: Any) -> None:
        if global_prefetch is not None:
            ch.basic_qos(prefetch_count=global_prefetch, global_qos=True)
        if prefetch is not None:
            ch.basic_qos(prefetch_count=prefetch)
        if global_prefetch is not None and prefetch is not None:
            ch.basic_qos(prefetch_count=global_prefetch, global_qos=True)
        ch.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": offset, **kwargs.pop("arguments", {})}, **kwargs)

    return run


def test_consume_refusals(amqp_url, names, broker_version) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    where = f"queue '{q}' in vhost '/'"
    # The texts changed in 4.0; 4.3 takes a global prefetch per consumer (global_qos denied) and
    # refuses an offset it cannot parse where 3.10 and 4.0 crashed (541).
    no_prefetch = f"stream {where}" if broker_version >= (4, 0) else f"'{where}'"
    auto_ack = f"stream {where}" if broker_version >= (4, 0) else f"stream queues {where}"

    def bad_offset(value: str) -> tuple[int, str]:
        return (
            406,
            f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {where}: {{invalid_stream_offset_arg,{{longstr,<<\"{value}\">>}}}}",
        )

    cases = [
        (_consume(q, prefetch=None), 406, f"PRECONDITION_FAILED - consumer prefetch count is not set for {no_prefetch}"),
        (_consume(q, auto_ack=True), 540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by {auto_ack}"),
        (_consume(q, offset="5"), *bad_offset("5")),
        (_consume(q, offset="FIRST"), *(bad_offset("FIRST") if broker_version >= (4, 3) else (541, "INTERNAL_ERROR"))),
        (
            _consume(q, arguments={"x-priority": 1}),
            406,
            f"PRECONDITION_FAILED - invalid arg 'x-priority' for {where} of queue type rabbit_stream_queue",
        ),
        (lambda ch: ch.basic_get(q), 540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {where}"),
        (lambda ch: ch.queue_purge(q), 540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {where}"),
    ]
    if broker_version < (4, 3):
        cases += [
            (
                _consume(q, prefetch=None, global_prefetch=5),
                406,
                f"PRECONDITION_FAILED - consumer prefetch count is not set for {no_prefetch}",
            ),
            (_consume(q, prefetch=5, global_prefetch=5), 540, f"NOT_IMPLEMENTED - {where} does not support global qos"),
        ]
    for fn, code, text in cases:
        assert _channel_refusal(amqp_url, fn) == (code, text)
    if broker_version >= (4, 3):
        for fn in (_consume(q, prefetch=None, global_prefetch=5), _consume(q, prefetch=5, global_prefetch=5)):
            conn = connect(amqp_url)
            fn(conn.channel())  # accepted: the global prefetch is the consumer's
            conn.close()


def test_a_later_per_consumer_qos_lifts_global_qos(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"a", b"b", b"c"])
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    ch.basic_qos(prefetch_count=2)  # RabbitMQ drops the channel-wide limit here
    got: list[int] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]), arguments={"x-stream-offset": 0})
    wait_for(lambda: len(got) >= 2 or conn.process_data_events(time_limit=0.05), timeout=15)
    conn.close()
    assert got[:2] == [0, 1]


@pytest.mark.parametrize("how", ["nack", "nack-discard", "reject", "recover"])
def test_nack_reject_and_recover(amqp_url, names, broker_version, how) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"a", b"b"])
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    tags: list[int] = []
    ch.basic_consume(q, lambda c, m, p, b: tags.append(m.delivery_tag), arguments={"x-stream-offset": 0})
    wait_for(lambda: tags or conn.process_data_events(time_limit=0.05), timeout=15)
    settle = {
        "nack": lambda: ch.basic_nack(tags[0], requeue=True),
        "nack-discard": lambda: ch.basic_nack(tags[0], requeue=False),
        "reject": lambda: ch.basic_reject(tags[0], requeue=True),
        "recover": lambda: ch.basic_recover(requeue=True),
    }[how]
    if broker_version >= (4, 0):
        # 4.x takes each as an ack: credit back, nothing redelivered, the next message comes.
        settle()
        wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(tags) == 2, timeout=15)
        conn.process_data_events(time_limit=0.3)
        assert ch.is_open and len(tags) == 2
        conn.close()
        return
    # 3.10 closes the connection.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        settle()
        wait_for(lambda: conn.process_data_events(time_limit=0.05), timeout=15)
    if how == "recover":
        assert (info.value.reply_code, info.value.reply_text) == (541, "INTERNAL_ERROR")
    else:
        assert (info.value.reply_code, info.value.reply_text) == (
            540,
            f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue '{q}' in vhost '/'",
        )


def test_unknown_delivery_tag_is_406(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    conn = connect(amqp_url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": 0})
    ch.basic_ack(99)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert (info.value.reply_code, info.value.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 99")
    conn.close()


# -- retention --------------------------------------------------------------------------


def test_max_length_bytes_truncates_whole_segments_from_the_head(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q, **SMALL_SEGMENTS, **{"x-max-length-bytes": 3000})
    _publish_each(amqp_url, q, [b"%03d" % i + b"x" * 97 for i in range(60)])
    offsets = _offsets(amqp_url, q, "first")
    assert offsets[0] > 0  # the head was truncated
    # A truncated offset starts at the first one kept (RabbitMQ truncates asynchronously,
    # so the head may move once more after the first read).
    wait_for(lambda: _offsets(amqp_url, q, 0)[0] == _offsets(amqp_url, q, "first")[0], timeout=15)
    # A new segment opens with a tracking chunk that takes an offset: offsets have gaps.
    assert offsets != list(range(offsets[0], offsets[-1] + 1))
    assert len(offsets) < 60
    wait_for(lambda: ready_count(amqp_url, q) < offsets[-1] + 1, timeout=20, interval=0.25)


def test_max_age_truncates_old_segments_when_a_new_one_starts(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q, **SMALL_SEGMENTS, **{"x-max-age": "1s"})
    _publish_each(amqp_url, q, [b"x" * 100] * 10)
    assert _offsets(amqp_url, q, "first")[0] == 0
    written = time.time()
    wait_for(lambda: time.time() > written + 1.5, timeout=5)
    assert _offsets(amqp_url, q, "first")[0] == 0  # age alone truncates nothing: only a new segment does
    _publish_each(amqp_url, q, [b"y" * 100] * 10)
    assert _offsets(amqp_url, q, "first")[0] > 0


def test_exclusive_is_ignored_and_delete_conditions_pass(amqp_url, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue("stream")
    _declare(amqp_url, q)
    _publish_each(amqp_url, q, [b"a"])
    consumer = connect(amqp_url)
    ch = consumer.channel()
    ch.basic_qos(prefetch_count=5)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    # From "next": nothing is delivered, so pika has nothing to reject on close (a reject
    # on a stream is a 540 connection close).
    ch.basic_consume(q, lambda *a: None, exclusive=True, arguments={"x-stream-offset": "next"})
    other = connect(amqp_url)
    och = other.channel()
    och.basic_qos(prefetch_count=5)
    och.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": "next"})  # an exclusive stream consumer does not lock others out
    other.close()
    admin = connect(amqp_url)
    # Neither the consumer nor the message stops a conditional delete of a stream.
    assert admin.channel().queue_delete(q, if_unused=True, if_empty=True).method.message_count == 0
    admin.close()
    wait_for(lambda: cancelled or consumer.process_data_events(time_limit=0.05), timeout=15)
    consumer.close()


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_other_queue_types_refuse_x_stream_offset(amqp_url, names, kind) -> None:  # type: ignore[no-untyped-def]
    # How a reader learns a queue is not a stream before anything is delivered or acked.
    q = names.queue(kind)
    conn = connect(amqp_url)
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": kind})
    conn.close()
    code, text = _channel_refusal(amqp_url, _consume(q, offset="first"))
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{q}' in vhost '/' of queue type rabbit_{kind}_queue",
    )
