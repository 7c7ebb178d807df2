"""``AmqpSourceOffset``: where a micro-batch ends, per queue, as an immutable value.

JSON form (what Spark writes to the checkpoint's offset log)::

    {"v": 1, "queues": {"orders": {"session": "3f2a9c1e.2", "tag": 1200}}}

``session`` names the consumer channel the deliveries came from: the source
run's random id and the channel's epoch (a new epoch after every reconnect).
``tag`` is the highest delivery tag of that channel included in the batch.
Delivery tags mean something only on their own channel, so an offset never
says how to re-read data; it identifies a batch so that the process that
planned it can serve and acknowledge it. An empty session means "nothing read
from this queue yet". Keys are sorted so equal offsets have equal JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AmqpSourceError

__all__ = ["AmqpSourceOffset", "QueuePosition"]

VERSION = 1


@dataclass(frozen=True, order=True)
class QueuePosition:
    session: str
    tag: int


@dataclass(frozen=True)
class AmqpSourceOffset:
    positions: tuple[tuple[str, QueuePosition], ...]

    @classmethod
    def initial(cls, queues: Iterable[str]) -> AmqpSourceOffset:
        return cls(tuple(sorted((q, QueuePosition("", 0)) for q in queues)))

    def position(self, queue: str) -> QueuePosition:
        for name, pos in self.positions:
            if name == queue:
                return pos
        return QueuePosition("", 0)

    def advanced(self, updates: Mapping[str, QueuePosition]) -> AmqpSourceOffset:
        merged = dict(self.positions)
        merged.update(updates)
        return AmqpSourceOffset(tuple(sorted(merged.items())))

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "queues": {q: {"session": p.session, "tag": p.tag} for q, p in self.positions}}

    @property
    def key(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | str) -> AmqpSourceOffset:
        data = json.loads(value) if isinstance(value, str) else value
        try:
            if data.get("v") != VERSION:
                raise ValueError(f"unsupported offset version {data.get('v')!r}")
            queues = data["queues"]
            if not isinstance(queues, Mapping):
                raise ValueError("'queues' must be an object")
            positions = []
            for queue, pos in queues.items():
                session, tag = pos["session"], pos["tag"]
                if not isinstance(session, str) or isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
                    raise ValueError(f"bad position for queue {queue!r}: {pos!r}")
                positions.append((str(queue), QueuePosition(session, tag)))
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise AmqpSourceError(f"not an AMQP source offset: {data!r} ({err})") from None
        return cls(tuple(sorted(positions)))
