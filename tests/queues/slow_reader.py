"""A consumer whose I/O thread stops reading after a number of deliveries: what a loaded machine does to it while the
broker has already handed it every message, and so reports the queue empty."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

import pytest

from spark_amqp.queues import available_now, io_session
from spark_amqp.queues.inbox import Delivery


class _HeldInbox(deque):  # type: ignore[type-arg]
    """From delivery ``hold_after + 1`` on, what the I/O thread reads waits aside, and the thread stops (once the
    session has subscribed, which the frames already read complete) until the gate opens."""

    def __init__(self, hold_after: int, gate: threading.Event, subscribed: threading.Event) -> None:
        super().__init__()
        self.hold_after, self.gate, self.subscribed, self.deliveries = hold_after, gate, subscribed, 0
        self.aside: list[Any] = []

    def append(self, item: Any) -> None:
        if isinstance(item, Delivery):
            self.deliveries += 1
        if self.aside or (self.deliveries > self.hold_after and not self.gate.is_set()):
            if not self.aside:
                asyncio.get_running_loop().call_soon(self._hold)
            self.aside.append(item)
            return
        super().append(item)

    def _hold(self) -> None:
        if not self.subscribed.is_set():
            asyncio.get_running_loop().call_later(0.005, self._hold)
            return
        self.gate.wait(60)
        self.extend(self.aside)
        self.aside.clear()


def hold_deliveries_until_measured(monkeypatch: pytest.MonkeyPatch, after: int) -> tuple[threading.Event, list[dict[str, int]]]:
    """Sessions started from now hold their I/O thread at delivery ``after + 1`` until an AvailableNow run has measured
    its queues' depths; (the gate, which the test sets when it ends; each measurement's depths)."""
    gate = threading.Event()
    measured: list[dict[str, int]] = []
    real = available_now.measure_depths
    started = io_session.IoSession.__init__

    def init(self: io_session.IoSession, *args: Any) -> None:
        started(self, *args)
        self.inbox = _HeldInbox(after, gate, self._started)

    monkeypatch.setattr(io_session.IoSession, "__init__", init)

    def measure(*args: Any) -> dict[str, int]:
        depths = real(*args)
        measured.append(depths)
        gate.set()
        return depths

    monkeypatch.setattr(available_now, "measure_depths", measure)
    return gate, measured
