"""Pure planning for stream mode: how far a micro-batch reads, and how it is split into tasks."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["StreamRange", "limit_ends", "split"]


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
