"""Time a test moves instead of waiting for it: ``tokens.clock`` (the wall clock of tokens and their renewal)
stands still until the test skips it forward, and the event loop's clock skips along, so that a timer due by
then (a ``Renewal``'s) runs at once. Otherwise the loop's clock runs as usual: a test's own short waits end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from spark_amqp.transport import tokens

T = TypeVar("T")


class SkippingLoop(asyncio.SelectorEventLoop):
    """An event loop whose time a test can move forward: the timers due by then run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped


class DrivenClock:
    """Seconds since the epoch that change only when the test calls ``skip_to`` (a ``tokens.clock``)."""

    def __init__(self, loop: SkippingLoop | None = None) -> None:
        self.now = time.time()
        self.loop = loop

    def __call__(self) -> float:
        return self.now

    def skip_to(self, when: float) -> None:
        """The clock moved to ``when`` (never back), and the loop's clock as far."""
        step = max(0.0, when - self.now)
        self.now += step
        if self.loop is not None:
            self.loop.skipped += step


def run_in_driven_time(monkeypatch: pytest.MonkeyPatch, scenario: Callable[[DrivenClock], Coroutine[Any, Any, T]]) -> T:
    """``scenario`` run on a ``SkippingLoop``, given the ``DrivenClock`` that is ``tokens.clock`` meanwhile."""
    with asyncio.Runner(loop_factory=SkippingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, SkippingLoop)
        clock = DrivenClock(loop)
        monkeypatch.setattr(tokens, "clock", clock)
        return runner.run(scenario(clock))


async def until(check: Callable[[], object], timeout: float = 20.0) -> None:
    """Until ``check()`` holds, for up to ``timeout`` real seconds: token fetches run on threads, in real time."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
