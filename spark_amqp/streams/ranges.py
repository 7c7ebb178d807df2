"""Pure planning for stream mode: how far a micro-batch reads, how it is split into tasks, and what a
jump in a range's offsets means."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SEGMENT_START_GAP", "StreamRange", "judge_gap", "limit_ends", "split"]

# Offsets RabbitMQ's tracking chunk takes where a segment starts (1 measured on 3.10.8, 4.0.5 and
# 4.3.6 with no consumer offsets tracked; up to 3 seen on 3.10 with them).
SEGMENT_START_GAP = 3


@dataclass(frozen=True)
class StreamRange:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one stream: what one task reads."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def limit_ends(starts: dict[str, int], ends: dict[str, int], total: int) -> dict[str, int]:
    """Ends that take at most ``total`` offsets in all, shared in proportion to each stream's backlog
    (as Kafka shares ``maxOffsetsPerTrigger`` over partitions); every stream with a backlog moves."""
    sizes = {s: max(0, ends[s] - starts[s]) for s in ends}
    backlog = sum(sizes.values())
    if backlog <= total:
        return dict(ends)
    shares = {s: (total * n) // backlog for s, n in sizes.items()}
    spare = total - sum(shares.values())
    # Hand what rounding left over to the largest backlogs first.
    for s in sorted(sizes, key=lambda s: (-sizes[s], s)):
        if spare <= 0:
            break
        if shares[s] < sizes[s]:
            shares[s] += 1
            spare -= 1
    return {s: starts[s] + shares[s] for s in ends}


def split(starts: dict[str, int], ends: dict[str, int], num_partitions: int | None, min_size: int) -> list[StreamRange]:
    """Ranges for the tasks of one batch: ``num_partitions`` in all, or one per ``min_size`` offsets,
    shared over the streams in proportion to their sizes; at least one per stream with data."""
    sizes = {s: ends[s] - starts[s] for s in sorted(ends) if ends[s] > starts[s]}
    total = sum(sizes.values())
    if total == 0:
        return []
    wanted = num_partitions if num_partitions is not None else math.ceil(total / min_size)
    ranges: list[StreamRange] = []
    for stream, size in sizes.items():
        parts = max(1, min(size, round(wanted * size / total)))
        step = math.ceil(size / parts)
        start = starts[stream]
        for lo in range(start, start + size, step):
            ranges.append(StreamRange(stream, lo, min(lo + step, start + size)))
    return ranges


def judge_gap(part: StreamRange, start: int, first: int, head: int | None) -> tuple[int, bool] | None:
    """A jump from ``start`` to ``first`` inside ``part``: None if nothing was lost, else (offsets lost, certain).

    ``head`` is the stream's first message now (None: it holds none). A stream that still begins
    at or before ``start`` kept those offsets, so they hold no messages. Otherwise retention moved
    past ``start``; a jump of at most ``SEGMENT_START_GAP`` offsets may also be only the tracking
    chunk opening the oldest segment left, which no AMQP 0-9-1 consumer can see: not certain."""
    if head is not None and head <= start:
        return None
    stop = min(first, part.end) if head is None else min(head, first, part.end)
    lost = stop - start
    if lost <= 0:
        return None
    return lost, lost > SEGMENT_START_GAP
