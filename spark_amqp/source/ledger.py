"""What may be acknowledged, and which redeliveries are copies of what Spark already has.

``SessionLedger`` lists one channel's deliveries in tag order with the batch
that owns each. Its ack frontier is the highest tag below which every delivery
belongs to a committed batch: one ``multiple=True`` ack up to it is always safe.
Acked entries are kept until a synchronous reply on the same channel proves
the broker processed the ack.

When a channel dies, every delivery of it that a batch owns (planned, or
committed with an unproven ack) is remembered in ``RedeliveryFilter``: the
broker will redeliver it on a new channel, and that copy is acknowledged with
its owner instead of being emitted again.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterator

from .session import Delivery

UNPLANNED = -1


class Entry:
    __slots__ = ("delivery", "owner", "tag")

    def __init__(self, tag: int, delivery: Delivery) -> None:
        self.tag = tag
        self.owner = UNPLANNED  # batch sequence number once planned or matched
        self.delivery = delivery


class SessionLedger:
    def __init__(self) -> None:
        self.unacked: deque[Entry] = deque()
        self.acked: deque[Entry] = deque()  # ack sent, not yet proven processed

    def add(self, entry: Entry) -> None:
        self.unacked.append(entry)

    def advance(self, committed: int) -> int | None:
        """Move the frontier past committed entries; the tag to multi-ack, or None."""
        unacked = self.unacked
        last = None
        while unacked:
            owner = unacked[0].owner
            if owner == UNPLANNED or owner > committed:
                break
            entry = unacked.popleft()
            self.acked.append(entry)
            last = entry.tag
        return last

    def confirmed(self, tag: int) -> None:
        acked = self.acked
        while acked and acked[0].tag <= tag:
            acked.popleft()

    def owned(self) -> Iterator[Entry]:
        """Entries a batch owns that the broker may still redeliver."""
        yield from self.acked
        for entry in self.unacked:
            if entry.owner != UNPLANNED:
                yield entry

    def __len__(self) -> int:
        return len(self.unacked) + len(self.acked)


def fingerprint(delivery: Delivery) -> tuple[str, str]:
    """How a redelivered copy is recognised: its message id, else a hash of its content."""
    props = delivery.props
    if props.message_id:
        return ("id", str(props.message_id))
    digest = hashlib.blake2b(delivery.body, digest_size=16)
    headers = props.headers or {}
    stable = (
        delivery.exchange,
        delivery.routing_key,
        props.correlation_id,
        props.timestamp,
        props.type,
        props.content_type,
        # Quorum queues restamp x-delivery-count on every delivery.
        sorted((k, repr(v)) for k, v in headers.items() if k != "x-delivery-count"),
    )
    digest.update(repr(stable).encode("utf-8", "surrogatepass"))
    return ("fp", digest.hexdigest())


class RedeliveryFilter:
    """A multiset of fingerprints per queue, each occurrence tied to the batch that owns it."""

    def __init__(self, retention_seconds: float = 1800.0) -> None:
        self.retention = retention_seconds
        self._owners: dict[tuple[str, tuple[str, str]], deque[tuple[int, float]]] = {}

    def remember(self, entry: Entry) -> None:
        key = (entry.delivery.queue, fingerprint(entry.delivery))
        self._owners.setdefault(key, deque()).append((entry.owner, time.monotonic() + self.retention))

    def match(self, delivery: Delivery) -> int | None:
        """The owning batch of a redelivered copy, consuming one occurrence; None if it is new."""
        if not self._owners:
            return None
        key = (delivery.queue, fingerprint(delivery))
        owners = self._owners.get(key)
        if not owners:
            return None
        owner, _ = owners.popleft()
        if not owners:
            del self._owners[key]
        return owner

    def expire(self) -> None:
        if not self._owners:
            return
        now = time.monotonic()
        for key in [k for k, v in self._owners.items() if v and v[-1][1] < now]:
            del self._owners[key]

    def __len__(self) -> int:
        return sum(len(v) for v in self._owners.values())
