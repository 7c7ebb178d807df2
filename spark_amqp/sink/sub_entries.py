"""Sub-entry batching in the stream sink (options ``subEntrySize`` and ``compression``).

A partition's messages for one stream go out ``subEntrySize`` at a time in one entry of the chunk,
compressed together (``stream_protocol/compression.py``), as RabbitMQ's Java client's
``subEntrySize`` and ``compression`` do. The broker keeps one publishing id per sub-entry, its last
message's, and confirms and deduplicates whole sub-entries, never a message inside one. So a retried
task or a replayed batch is deduplicated only if it cuts its sub-entries where the first attempt did:
they are cut by the messages' count and sizes alone, never by timing, and the same rows make the same
sub-entries under the same ids.

A sub-entry is also cut early when its messages would no longer fit one publish frame once compressed
(the codecs' framing adds a few bytes per 64 KiB at worst, kept as a margin).
"""

from __future__ import annotations

from ..errors import AmqpPublishError
from ..stream_protocol.compression import SUB_ENTRY, codec_id, encode
from .stream_messages import StreamMessage

__all__ = ["SubEntries", "uncompressed_limit"]

# What a publish frame holds around one sub-entry: size, key, version, publisher id, count, publishing id.
_FRAME_AROUND = 4 + 2 + 2 + 1 + 4 + 8


def uncompressed_limit(frame_max: int) -> int:
    """The most bytes of messages (each with its 4-byte size) one sub-entry takes, for a broker's ``frame_max``."""
    room = frame_max - _FRAME_AROUND - SUB_ENTRY.size
    return room - 64 - room // 256


class SubEntries:
    """Groups the messages of one partition, per stream, into sub-entries (``StreamMessage``s with ``sub_entry``)."""

    def __init__(self, size: int, compression: str, frame_max: int) -> None:
        self.size = size
        self.compression = compression
        self.codec = codec_id(compression)
        self.limit = uncompressed_limit(frame_max)
        self._room = frame_max - _FRAME_AROUND
        self._groups: dict[int, list[StreamMessage]] = {}  # per target, the messages of its open sub-entry
        self._bytes: dict[int, int] = {}

    def add(self, message: StreamMessage) -> StreamMessage | None:
        """Take ``message``; a sub-entry that is complete now (it was full, or this one would not have fit), if any."""
        target = message.target
        group = self._groups.setdefault(target, [])
        size = 4 + len(message.record)
        done = None
        if group and self._bytes[target] + size > self.limit:
            done = self._close(target)
            group = self._groups[target] = []
        group.append(message)
        self._bytes[target] = self._bytes.get(target, 0) + size
        if len(group) == self.size:
            done = self._close(target)
        return done

    def next_open(self) -> StreamMessage | None:
        """At the partition's end: the next sub-entry still open, closed now (None when none is left)."""
        for target in sorted(self._groups):
            if self._groups[target]:
                return self._close(target)
        return None

    def _close(self, target: int) -> StreamMessage:
        group = self._groups[target]
        self._groups[target], self._bytes[target] = [], 0
        entry = encode(self.codec, [m.record for m in group])
        if len(entry) > self._room:  # the margin makes this unreachable for every codec: a guard, not a path
            raise AmqpPublishError(
                f"a sub-entry of {len(group)} messages is {len(entry)} bytes compressed with {self.compression}, more than a "
                f"publish frame holds ({self._room}); lower option 'subEntrySize'"
            )
        last = group[-1]
        return StreamMessage(target, last.publishing_id, None, entry, messages=len(group), sub_entry=True)
