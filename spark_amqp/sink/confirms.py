"""``ConfirmWindow``: the publisher confirms of one connection, counted by publish sequence number.

Confirms are processed as they arrive (the socket's reader calls back); a
publisher waits only when the window is full, and at the end until every
message it sent is answered. With ``keep``, the window also holds each message
until it is confirmed, so that the messages of a connection that let the
publisher down can be published again on another.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Generic, TypeVar

M = TypeVar("M")


class ConfirmWindow(Generic[M]):
    """Counts published, acked and failed messages by publish sequence number."""

    def __init__(self, limit: int, keep: bool = False) -> None:
        self.limit = limit
        self.keep = keep
        self._kept: deque[tuple[int, M]] = deque()  # with keep: (seq, message) not yet known to be answered
        self.published = 0
        self.confirmed_up_to = 0  # every seq <= this has an answer
        self.acked = 0
        self.nacked = 0
        self.returned: list[tuple[int, str, str, str]] = []
        self._answered: set[int] = set()  # answered out of order (single confirms past a gap)
        self._room = asyncio.Event()
        self._room.set()

    @property
    def answered(self) -> int:
        """Messages the broker has acked or nacked so far."""
        return self.confirmed_up_to + len(self._answered)

    @property
    def outstanding(self) -> int:
        return self.published - self.answered

    def sent(self, count: int = 1, message: M | None = None) -> None:
        self.published += count
        if self.keep and message is not None:
            self._kept.append((self.published, message))
        if self.outstanding >= self.limit:
            self._room.clear()

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        if multiple:
            count = tag - self.confirmed_up_to - sum(1 for t in self._answered if t <= tag)
            self._answered = {t for t in self._answered if t > tag}
            self.confirmed_up_to = max(self.confirmed_up_to, tag)
        else:
            count = 1
            self._answered.add(tag)
            while self.confirmed_up_to + 1 in self._answered:
                self.confirmed_up_to += 1
                self._answered.discard(self.confirmed_up_to)
        kept = self._kept
        while kept and kept[0][0] <= self.confirmed_up_to:
            kept.popleft()
        if ack:
            self.acked += count
        else:
            self.nacked += count
        if self.outstanding < self.limit:
            self._room.set()

    def unanswered(self) -> list[M]:
        """The kept messages the broker has not answered, in the order they were sent."""
        return [m for seq, m in self._kept if seq > self.confirmed_up_to and seq not in self._answered]

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.returned.append((code, text, exchange, routing_key))

    async def wait_for_room(self, timeout: float, failed: asyncio.Future[BaseException]) -> bool:
        """True when there is room; False when ``timeout`` passed without any confirm."""
        while not self._room.is_set():
            before = self.answered
            waiter: asyncio.Future[Any] = asyncio.ensure_future(self._room.wait())
            done, _ = await asyncio.wait([waiter, failed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if failed in done:
                return True  # the caller sees the failure
            if not done and self.answered == before:
                return False
        return True

    async def wait_until_all_answered(self, timeout: float, failed: asyncio.Future[BaseException]) -> bool:
        """True when every message is answered (or ``failed`` fired); False after ``timeout`` without progress."""
        loop = asyncio.get_running_loop()
        before = self.answered
        deadline = loop.time() + timeout
        while self.outstanding and not failed.done():
            await asyncio.sleep(0.005)
            if self.answered != before:
                before = self.answered
                deadline = loop.time() + timeout
            elif loop.time() > deadline:
                return False
        return True
