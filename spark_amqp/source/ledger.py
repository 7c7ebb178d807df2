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
from collections import Counter, deque
from collections.abc import Iterable, Iterator

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

    def settled(self, committed: int) -> bool:
        """Every committed delivery is acked and the broker has proven it."""
        return not self.acked and all(e.owner == UNPLANNED or e.owner > committed for e in self.unacked)

    def unproven(self, committed: int) -> Iterator[int]:
        """Batches that own a committed delivery whose ack the broker has not yet been proven to process."""
        for entry in self.acked:
            yield entry.owner
        for entry in self.unacked:
            if entry.owner != UNPLANNED and entry.owner <= committed:
                yield entry.owner

    def owned(self) -> Iterator[Entry]:
        """Entries a batch owns that the broker may still redeliver."""
        yield from self.acked
        for entry in self.unacked:
            if entry.owner != UNPLANNED:
                yield entry

    def __len__(self) -> int:
        return len(self.unacked) + len(self.acked)


Fingerprint = tuple[str, str]

# Headers a broker stamps on a redelivery and changes on every return, so a copy's content
# differs from the first delivery's in them and nowhere else: quorum queues' return counts
# (x-delivery-count; from RabbitMQ 4.3 also x-acquired-count, which counts nacks too).
REDELIVERY_HEADERS = frozenset({"x-delivery-count", "x-acquired-count"})


def fingerprint(delivery: Delivery, by: str = "messageId") -> Fingerprint:
    """How a redelivered copy is recognised: its message id (when ``by`` is messageId and it has one), else its content."""
    props = delivery.props
    if by == "messageId" and props.message_id:
        return ("id", str(props.message_id))
    digest = hashlib.blake2b(delivery.body, digest_size=16)
    headers = props.headers or {}
    stable = (
        delivery.exchange,
        delivery.routing_key,
        props.message_id,
        props.correlation_id,
        props.timestamp,
        props.type,
        props.content_type,
        sorted((k, repr(v)) for k, v in headers.items() if k not in REDELIVERY_HEADERS),
    )
    digest.update(repr(stable).encode("utf-8", "surrogatepass"))
    return ("fp", digest.hexdigest())


class RedeliveryFilter:
    """A multiset of fingerprints per queue, each occurrence tied to the batch that owns it.

    Copies with the same fingerprint are interchangeable, so what matters is how
    many to emit. When a channel dies, its unplanned deliveries (never emitted)
    come back for certain and must be emitted; its owned deliveries come back
    too, except those whose ack the broker did process. So for each fingerprint
    the first ``unplanned`` redelivered copies pass, and up to ``owned`` more are
    dropped: the count emitted is right whichever way the unproven acks went.
    """

    def __init__(self, retention_seconds: float = 1800.0, by: str = "messageId") -> None:
        self.retention = retention_seconds
        self.by = by
        self._owners: dict[tuple[str, Fingerprint], deque[int]] = {}
        self._pass: dict[tuple[str, Fingerprint], int] = {}
        self._expiry: dict[tuple[str, Fingerprint], float] = {}
        self._per_owner: Counter[int] = Counter()

    def session_lost(self, owned: list[Entry], unplanned: list[Entry]) -> None:
        self.expect(((e.delivery.queue, fingerprint(e.delivery, self.by)), e.owner) for e in owned)
        if not self._owners:
            return
        for entry in unplanned:
            key = (entry.delivery.queue, fingerprint(entry.delivery, self.by))
            if key in self._owners:
                self._pass[key] = self._pass.get(key, 0) + 1

    def expect(self, copies: Iterable[tuple[tuple[str, Fingerprint], int]]) -> None:
        """Copies that may come back redelivered, each ``((queue, fingerprint), owning batch)``."""
        expires = time.monotonic() + self.retention
        for key, owner in copies:
            self._owners.setdefault(key, deque()).append(owner)
            self._expiry[key] = expires
            self._per_owner[owner] += 1

    def match(self, delivery: Delivery) -> int | None:
        """The owning batch of a redelivered copy, consuming one occurrence; None if it is to be emitted."""
        if not self._owners:
            return None
        key = (delivery.queue, fingerprint(delivery, self.by))
        owners = self._owners.get(key)
        if not owners:
            return None
        passing = self._pass.get(key, 0)
        if passing:
            self._pass[key] = passing - 1
            return None
        # Credit the copy to the newest batch that holds this fingerprint: the
        # copy may be that batch's own message, and acking it with an older,
        # committed batch would ack it before its batch commits. Acking later
        # is always safe.
        newest = max(range(len(owners)), key=owners.__getitem__)
        owner = owners[newest]
        del owners[newest]
        self._per_owner[owner] -= 1
        if not owners:
            self._forget(key)
        return owner

    def holds(self, owner: int) -> bool:
        """Whether a copy owned by batch ``owner`` is still expected."""
        return self._per_owner[owner] > 0

    def _forget(self, key: tuple[str, Fingerprint]) -> None:
        for owner in self._owners.pop(key, ()):
            self._per_owner[owner] -= 1
        self._pass.pop(key, None)
        self._expiry.pop(key, None)

    def expire(self) -> None:
        if not self._expiry:
            return
        now = time.monotonic()
        for key in [k for k, t in self._expiry.items() if t < now]:
            self._forget(key)

    def __len__(self) -> int:
        return sum(len(v) for v in self._owners.values())
