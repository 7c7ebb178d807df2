"""``StreamOffset``: per stream, the next offset to read, as an immutable value.

JSON form (what Spark writes to the checkpoint's offset log), keys sorted as
Kafka's are::

    {"events": [1200, "5f0c2a9d41b7e3c8"], "orders": 0}

``-1`` means the query has not yet fixed where it starts reading that stream:
the first micro-batch of a new query fixes it (``startingOffsets``) and reads
nothing, so that a replay of that batch after a crash starts at the same place.

A position can carry a mark: a digest of the body of the message just before it
(offset ``position - 1``). A stream deleted and declared again restarts at
offset 0; once it has grown past the query's position, the position alone no
longer tells the two streams apart, but the message there does. Positions that
a batch has not read up to yet (where the query starts) have no mark, and a
plain number is the form checkpoints written before marks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import AmqpSourceError

__all__ = ["UNSET", "StreamOffset", "mark_of"]

UNSET = -1
MARK_BYTES = 8


def mark_of(body: bytes) -> str:
    """The mark of a message: its body alone, as the broker stores it. Headers and properties are
    left out on purpose: brokers re-encode them across versions, and a false mismatch would stop the
    query for good."""
    return hashlib.blake2b(body, digest_size=MARK_BYTES).hexdigest()


@dataclass(frozen=True)
class StreamOffset:
    positions: tuple[tuple[str, int], ...]
    # Identify the streams; positions alone say where a batch starts and ends, so equality leaves them out.
    marks: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, positions: Mapping[str, int], marks: Mapping[str, str] | None = None) -> StreamOffset:
        kept = {s: m for s, m in (marks or {}).items() if s in positions and positions[s] > 0}
        return cls(tuple(sorted(positions.items())), tuple(sorted(kept.items())))

    @classmethod
    def unset(cls, streams: Iterable[str]) -> StreamOffset:
        return cls.of(dict.fromkeys(streams, UNSET))

    def get(self, stream: str) -> int:
        """The stream's position; a stream the checkpoint does not know yet is ``UNSET``."""
        return dict(self.positions).get(stream, UNSET)

    def mark(self, stream: str) -> str | None:
        return dict(self.marks).get(stream)

    def as_dict(self) -> dict[str, int]:
        return dict(self.positions)

    def marks_dict(self) -> dict[str, str]:
        return dict(self.marks)

    def to_json(self) -> dict[str, Any]:
        marks = dict(self.marks)
        return {s: [n, marks[s]] if s in marks else n for s, n in self.positions}

    @property
    def key(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | str) -> StreamOffset:
        data = json.loads(value) if isinstance(value, str) else value
        if not isinstance(data, Mapping) or "queues" in data:
            raise AmqpSourceError(
                f"not a stream offset: {data!r}. A checkpoint written in queue mode cannot be read in stream mode: "
                "start this query with a new checkpointLocation"
            )
        positions: dict[str, int] = {}
        marks: dict[str, str] = {}
        for stream, value in data.items():
            offset, mark = value if isinstance(value, list) and len(value) == 2 else (value, None)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < UNSET:
                raise AmqpSourceError(f"not a stream offset: stream {stream!r} has position {value!r}")
            if mark is not None and not (isinstance(mark, str) and len(mark) == 2 * MARK_BYTES):
                raise AmqpSourceError(f"not a stream offset: stream {stream!r} has position {value!r}")
            positions[str(stream)] = offset
            if mark is not None:
                marks[str(stream)] = mark
        return cls.of(positions, marks)
