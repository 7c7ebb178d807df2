"""The backlog the source reports for Spark's progress (``reportLatestOffset``), on both brokers."""

from __future__ import annotations

import time

from ..brokers import publish
from .driver import MicroBatchDriver


def _backlog_after_refresh(d: MicroBatchDriver) -> dict:  # type: ignore[type-arg]
    d.runtime._backlog_at = -1e9  # skip the one-second cache: the test wants a fresh measurement
    value = d.runtime.backlog()
    assert value is not None
    return value


def test_backlog_goes_from_n_to_zero_as_the_queue_drains(amqp_url: str, names) -> None:  # type: ignore[no-untyped-def]
    q = names.queue()
    publish(amqp_url, q, [b"m%d" % i for i in range(60)])
    d = MicroBatchDriver(amqp_url, q, maxMessagesPerTrigger=10, prefetch=20)
    try:
        assert d.runtime.backlog() is None  # nothing measured before the consumer runs
        d.runtime.ensure_started()
        deadline = time.monotonic() + 20
        while True:  # until the prefetch window is full, the split between the two moves
            d.runtime.latest_offset(d.start, 0)
            first = _backlog_after_refresh(d)[q]
            if first["prefetched"] == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert first == {"ready": 40, "prefetched": 20}
        d.drain(60, max_rows=10)
        seen = _backlog_after_refresh(d)[q]
        assert seen == {"ready": 0, "prefetched": 0}
    finally:
        d.close()


def test_backlog_is_cached_for_a_second(embedded) -> None:  # type: ignore[no-untyped-def]
    publish(embedded.url, "q", [b"x"] * 5)
    d = MicroBatchDriver(embedded.url, "q")
    try:
        d.runtime.ensure_started()
        first = d.runtime.backlog()
        publish(embedded.url, "q", [b"y"] * 5, declare=False)
        assert d.runtime.backlog() is first  # no second round of declares within the interval
    finally:
        d.close()
