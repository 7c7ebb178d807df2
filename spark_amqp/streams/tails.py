"""``TailWatch``: where each stream ends, measured again only after something was written.

A probe at ``last`` costs the stream's whole last chunk on the wire, and Spark
polls an idle source about every 10 ms. So next to each measured end sits a watcher: a consumer at
``next`` with prefetch 1 that never acks. It gets the first chunk written after
it attached and then nothing more, and that delivery is the signal to measure
again. An idle stream costs nothing; a busy one costs two chunks per batch,
whatever it holds. The watcher attaches before the probe, so nothing written in
between goes unnoticed.

A watcher that the broker cancels (the stream was deleted, or the member it read
from went away) also means "measure again", and so does an end older than
``REMEASURE``: the safety net for a signal that never comes. Measuring a deleted
stream fails with the broker's 404, so the query fails instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Any

from ..client import AmqpClient, ClientChannel
from ..reading import stream_consumers
from . import probe
from .offset import mark_of

__all__ = ["REMEASURE", "TailBook", "TailWatch"]

_tags = itertools.count(1)
REMEASURE = 5.0  # seconds an idle stream's end is trusted without a signal


class TailBook:
    """What both protocols' tail watches share: which end is still good, and the bookkeeping of a measurement.
    A subclass keeps one watcher per stream (``_watching``, ``_rewatch``) and measures (``_tail``)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.ends: dict[str, int] = {}
        self.measured: dict[str, float] = {}
        self.moved: set[str] = set()
        self.marks: dict[str, str] = {}  # the mark of each measured end (the last message's)
        # Streams that may have been deleted and declared again unseen: their watcher was cancelled, or the
        # connection that held it was replaced. ``Identities`` checks their positions again.
        self.suspects: set[str] = set()
        self.probes = 0  # how many times an end was measured (for tests and logs)

    async def ends_of(self, client: Any, streams: Sequence[str]) -> dict[str, int]:
        """``end`` of each stream, measured side by side (an empty one may take ``waits.EMPTY_WAIT``)."""
        found = await asyncio.gather(*(self.end(client, s) for s in streams))
        return dict(zip(streams, found, strict=True))

    async def end(self, client: Any, stream: str) -> int:
        """The offset after the stream's last message (0 when it has none)."""
        if client is not self.client:  # a new connection: every watcher went with the old one
            if self.client is not None:
                self.suspects.update(self.ends)
            self.client, self.ends, self.moved, self.marks = client, {}, set(), {}
            self._new_client(client)
        fresh = time.monotonic() - self.measured.get(stream, -REMEASURE) < REMEASURE
        if self._watching(stream) and stream not in self.moved and stream in self.ends and fresh:
            return self.ends[stream]
        self.moved.discard(stream)
        await self._rewatch(client, stream)
        last = await self._tail(client, stream)
        self.probes += 1
        self.measured[stream] = time.monotonic()
        self.ends[stream] = 0 if last is None else last[0] + 1
        if last is None:
            self.marks.pop(stream, None)
        else:
            self.marks[stream] = mark_of(last[1])
        return self.ends[stream]

    def take_suspects(self) -> set[str]:
        taken, self.suspects = self.suspects, set()
        return taken

    def _new_client(self, client: Any) -> None:
        raise NotImplementedError

    def _watching(self, stream: str) -> bool:
        raise NotImplementedError

    async def _rewatch(self, client: Any, stream: str) -> None:
        """Drop the stream's watcher, if any, and attach a new one: before the measurement, so nothing
        written in between goes unnoticed."""
        raise NotImplementedError

    async def _tail(self, client: Any, stream: str) -> tuple[int, bytes] | None:
        raise NotImplementedError


class TailWatch(TailBook):
    """Over AMQP 0-9-1: a watcher is a channel consuming at ``next`` with prefetch 1."""

    def __init__(self) -> None:
        super().__init__()
        self.watchers: dict[str, ClientChannel] = {}

    def _new_client(self, client: AmqpClient) -> None:
        self.watchers = {}

    def _watching(self, stream: str) -> bool:
        watcher = self.watchers.get(stream)
        return watcher is not None and watcher.is_open

    async def _rewatch(self, client: AmqpClient, stream: str) -> None:
        watcher = self.watchers.pop(stream, None)
        if watcher is not None:
            await watcher.close()  # its unacked delivery goes with it: streams do not requeue
        self.watchers[stream] = await self._watch(client, stream)

    async def _tail(self, client: AmqpClient, stream: str) -> tuple[int, bytes] | None:
        return await probe.tail(client, stream)

    async def _watch(self, client: AmqpClient, stream: str) -> ClientChannel:
        channel = await client.channel()

        def on_delivery(*_: object) -> None:
            self.moved.add(stream)

        def on_cancel(*_: object) -> None:
            self.moved.add(stream)
            self.suspects.add(stream)

        channel.on_delivery = on_delivery
        channel.on_cancel = on_cancel  # deleted, or its member went: measuring again finds out which
        await stream_consumers.consume(channel, stream, f"spark-amqp-watch-{next(_tags)}", "next", 1)
        return channel
