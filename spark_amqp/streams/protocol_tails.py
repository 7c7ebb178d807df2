"""``ProtocolTailWatch``: ``TailWatch`` over the stream protocol.

The same bargain as over AMQP 0-9-1 (see ``tails``): next to each measured end
sits a subscription at ``next`` with one credit that is never renewed. Its one
chunk, or a metadata update for its stream (deleted, or its leader moved), is
the signal to measure again; so is an end older than ``REMEASURE``. A
measurement reads the stream's last chunk (``protocol_probe.tail``).
"""

from __future__ import annotations

from ..errors import StreamResponseError
from ..stream_protocol.client import OffsetSpec, StreamClient
from ..stream_protocol.topology import STREAM_NOT_AVAILABLE, member_client
from . import protocol_probe
from .tails import TailBook

__all__ = ["ProtocolTailWatch"]


class ProtocolTailWatch(TailBook):
    def __init__(self) -> None:
        super().__init__()
        # stream -> (the connection holding its watcher, the subscription): the planner's own, or one to a node
        # that holds the stream where the planner's node holds no member (0x06).
        self.watchers: dict[str, tuple[StreamClient, int]] = {}

    def _new_client(self, client: StreamClient) -> None:
        self.watchers = {}
        client.on_metadata_update = self._on_metadata_update

    def _watching(self, stream: str) -> bool:
        watcher = self.watchers.get(stream)
        return watcher is not None and not watcher[0].closed.done()

    async def _rewatch(self, client: StreamClient, stream: str) -> None:
        old = self.watchers.pop(stream, None)
        if old is not None and old[1] in old[0].subscriptions and not old[0].closed.done():
            await old[0].unsubscribe(old[1])

        def on_chunk(_: memoryview) -> None:
            self.moved.add(stream)

        owner = client
        try:
            sub = protocol_probe.free_subscription(owner)
            await owner.subscribe(sub, stream, OffsetSpec.NEXT, 1, on_chunk)
        except StreamResponseError as err:
            if err.code != STREAM_NOT_AVAILABLE:
                raise
            owner = await member_client(client, stream)
            owner.on_metadata_update = self._on_metadata_update
            sub = protocol_probe.free_subscription(owner)
            await owner.subscribe(sub, stream, OffsetSpec.NEXT, 1, on_chunk)
        self.watchers[stream] = (owner, sub)

    async def _tail(self, client: StreamClient, stream: str) -> tuple[int, bytes] | None:
        return await protocol_probe.tail(client, stream)

    def _on_metadata_update(self, code: int, stream: str) -> None:
        # The broker ends the stream's subscriptions itself: a new watcher is needed, and the stream may be another one now.
        watcher = self.watchers.pop(stream, None)
        if watcher is not None:
            watcher[0].subscriptions.pop(watcher[1], None)
        self.moved.add(stream)
        self.suspects.add(stream)
