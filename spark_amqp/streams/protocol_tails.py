"""``ProtocolTailWatch``: ``TailWatch`` over the stream protocol.

The same bargain as over AMQP 0-9-1 (see ``tails``): next to each measured end
sits a subscription at ``next`` with one credit that is never renewed. Its one
chunk, or a metadata update for its stream (deleted, or its leader moved), is
the signal to measure again; so is an end older than ``REMEASURE``. A
measurement reads the stream's last chunk (``protocol_probe.tail``).
"""

from __future__ import annotations

from ..stream_protocol.client import OffsetSpec, StreamClient
from . import protocol_probe
from .tails import TailBook

__all__ = ["ProtocolTailWatch"]


class ProtocolTailWatch(TailBook):
    def __init__(self) -> None:
        super().__init__()
        self.watchers: dict[str, int] = {}  # stream -> subscription id

    def _new_client(self, client: StreamClient) -> None:
        self.watchers = {}
        client.on_metadata_update = self._on_metadata_update

    def _watching(self, stream: str) -> bool:
        return stream in self.watchers

    async def _rewatch(self, client: StreamClient, stream: str) -> None:
        sub = self.watchers.pop(stream, None)
        if sub is not None and sub in client.subscriptions:
            await client.unsubscribe(sub)

        def on_chunk(_: memoryview) -> None:
            self.moved.add(stream)

        sub = protocol_probe.free_subscription(client)
        await client.subscribe(sub, stream, OffsetSpec.NEXT, 1, on_chunk)
        self.watchers[stream] = sub

    async def _tail(self, client: StreamClient, stream: str) -> tuple[int, bytes] | None:
        return await protocol_probe.tail(client, stream)

    def _on_metadata_update(self, code: int, stream: str) -> None:
        # The broker ends the stream's subscriptions itself: a new watcher is needed, and the stream may be another one now.
        sub = self.watchers.pop(stream, None)
        if sub is not None and self.client is not None:
            self.client.subscriptions.pop(sub, None)
        self.moved.add(stream)
        self.suspects.add(stream)
