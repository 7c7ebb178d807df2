"""``StreamOffset``: per stream, the next offset to read, as an immutable value.

JSON form (what Spark writes to the checkpoint's offset log), keys sorted as
Kafka's are::

    {"events": 1200, "orders": 0}

``-1`` means the query has not yet fixed where it starts reading that stream:
the first micro-batch of a new query fixes it (``startingOffsets``) and reads
nothing, so that a replay of that batch after a crash starts at the same place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AmqpSourceError

__all__ = ["UNSET", "StreamOffset"]

UNSET = -1


@dataclass(frozen=True)
class StreamOffset:
    positions: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, positions: Mapping[str, int]) -> StreamOffset:
        return cls(tuple(sorted(positions.items())))

    @classmethod
    def unset(cls, streams: Iterable[str]) -> StreamOffset:
        return cls.of(dict.fromkeys(streams, UNSET))

    def get(self, stream: str) -> int:
        """The stream's position; a stream the checkpoint does not know yet is ``UNSET``."""
        return dict(self.positions).get(stream, UNSET)

    def as_dict(self) -> dict[str, int]:
        return dict(self.positions)

    def to_json(self) -> dict[str, Any]:
        return dict(self.positions)

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
        for stream, offset in data.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < UNSET:
                raise AmqpSourceError(f"not a stream offset: stream {stream!r} has position {offset!r}")
            positions[str(stream)] = offset
        return cls.of(positions)
