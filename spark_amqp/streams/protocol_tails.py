"""``ProtocolTailWatch``: ``TailWatch`` over the stream protocol.

The same bargain as over AMQP 0-9-1 (see ``tails``): next to each measured end
sits a subscription at ``next`` with one credit that is never renewed. Its one
chunk, or a metadata update for its stream (deleted, or its leader moved), is
the signal to measure again; so is an end older than ``REMEASURE``. A
measurement reads the stream's last chunk (``protocol_probe.tail``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ..stream_protocol.client import OffsetSpec, StreamClient
from . import protocol_probe
from .offset import mark_of
from .tails import REMEASURE

__all__ = ["ProtocolTailWatch"]


class ProtocolTailWatch:
    def __init__(self) -> None:
        self.client: StreamClient | None = None
        self.watchers: dict[str, int] = {}  # stream -> subscription id
        self.ends: dict[str, int] = {}
        self.measured: dict[str, float] = {}
        self.moved: set[str] = set()
        self.marks: dict[str, str] = {}
        self.suspects: set[str] = set()
        self.probes = 0

    async def ends_of(self, client: StreamClient, streams: Sequence[str]) -> dict[str, int]:
        found = await asyncio.gather(*(self.end(client, s) for s in streams))
        return dict(zip(streams, found, strict=True))

    async def end(self, client: StreamClient, stream: str) -> int:
        if client is not self.client:
            if self.client is not None:
                self.suspects.update(self.ends)
            self.client, self.watchers, self.ends, self.moved, self.marks = client, {}, {}, set(), {}
            client.on_metadata_update = self._on_metadata_update
        fresh = time.monotonic() - self.measured.get(stream, -REMEASURE) < REMEASURE
        if stream in self.watchers and stream not in self.moved and stream in self.ends and fresh:
            return self.ends[stream]
        sub = self.watchers.pop(stream, None)
        if sub is not None and sub in client.subscriptions:
            await client.unsubscribe(sub)
        await self._watch(client, stream)
        last = await protocol_probe.tail(client, stream)
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

    async def _watch(self, client: StreamClient, stream: str) -> None:
        self.moved.discard(stream)

        def on_chunk(_: memoryview) -> None:
            self.moved.add(stream)

        sub = protocol_probe.free_subscription(client)
        await client.subscribe(sub, stream, OffsetSpec.NEXT, 1, on_chunk)
        self.watchers[stream] = sub

    def _on_metadata_update(self, code: int, stream: str) -> None:
        # The broker ends the stream's subscriptions itself: a new watcher is needed, and the stream may be another one now.
        sub = self.watchers.pop(stream, None)
        if sub is not None and self.client is not None:
            self.client.subscriptions.pop(sub, None)
        self.moved.add(stream)
        self.suspects.add(stream)
