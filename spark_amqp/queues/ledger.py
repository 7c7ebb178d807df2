"""What may be acknowledged, and which redeliveries are copies of what Spark already has.

``SessionLedger`` lists one channel's deliveries in tag order with the batch
that owns each. Its ack frontier is the highest tag below which every delivery
may be acknowledged: its owner is committed (without a journal) or is in the
journal (with one, whose entries hold the messages from then on). One
``multiple=True`` ack up to it is always safe. A delivery the journal holds
behind one that is not yet planned (a redelivered copy, a rescued redelivery)
is acknowledged on its own instead, and the frontier's later multi-ack never
names its tag (RabbitMQ refuses a multi-ack whose own tag was already acked:
406 unknown delivery tag). Every round of acks gets a number, in the order it
is sent; acked entries are kept until a synchronous reply on the same channel,
sent after that round, proves the broker processed it.

When a channel dies, every delivery of it that a batch owns (planned, or
acked with the ack not yet proven) is remembered in ``RedeliveryFilter``: the
broker will redeliver it on a new channel, and that copy is acknowledged with
its owner instead of being emitted again. Its unplanned deliveries are counted
there too: they come back for certain, and are emitted. With a journal, the
channel's last proven acks (``recent``, at most a prefetch window of them) are
remembered too: a proven ack is one the channel took, not one a quorum queue
applied (see ``copies``).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from .inbox import Delivery

UNPLANNED = -1
APART = -2  # settled on its own outside any batch (dead-lettered): holds no ack frontier back
SUPERSEDED = -3  # the broker sent its message again (``copies``): acked with the frontier, which the broker ignores
RETURNED = -4  # RedeliveryFilter.judge: one of a lost channel's unplanned deliveries, back: emitted, looked up no further
PENDING, MULTI, SINGLE = 0, 1, 2  # Entry.acked: not yet, by the frontier's multi-ack, on its own


class Entry:
    __slots__ = ("acked", "delivery", "owner", "round", "tag")

    def __init__(self, tag: int, delivery: Delivery) -> None:
        self.tag = tag
        self.owner = UNPLANNED  # batch sequence number once planned or matched
        self.delivery = delivery
        self.acked = PENDING
        self.round = 0  # the ack round that covered it


class Acks(NamedTuple):
    """One round of acks for a channel: a multi-ack up to ``multiple`` and single acks, proven as ``round``."""

    multiple: int | None
    singles: list[int]
    round: int


class SessionLedger:
    def __init__(self, window: int = 0) -> None:
        self.unacked: deque[Entry] = deque()  # in tag order, up to and beyond the frontier
        self.acked: deque[Entry] = deque()  # ack sent, not yet proven; in round order
        self.recent: deque[Entry] = deque(maxlen=window)  # the last ``window`` proven, in proof order
        self.rounds = 0
        self._claimed = False  # an entry behind the frontier got an owner since the last round

    def add(self, entry: Entry) -> None:
        self.unacked.append(entry)

    def claim(self, entry: Entry, owner: int) -> None:
        entry.owner = owner
        self._claimed = True

    def next_acks(self, ackable: int, singles: bool = False) -> Acks | None:
        """Move the frontier past entries owned by batch ``ackable`` or earlier; with ``singles``, owned
        entries behind it are acked on their own. None when there is nothing to send."""
        unacked = self.unacked
        moved: list[Entry] = []
        last = None
        while unacked:
            entry = unacked[0]
            if entry.owner == UNPLANNED or entry.owner > ackable:
                break
            unacked.popleft()
            if entry.acked == PENDING:
                entry.acked = MULTI
                moved.append(entry)
                last = entry.tag
        single: list[Entry] = []
        if singles and self._claimed:
            single = [e for e in unacked if e.acked == PENDING and e.owner != UNPLANNED and e.owner <= ackable]
            for entry in single:
                entry.acked = SINGLE
        self._claimed = False
        if not moved and not single:
            return None
        self.rounds += 1
        for entry in (*moved, *single):
            entry.round = self.rounds
            self.acked.append(entry)
        # Entries of the multi-ack that come after its last tag were acked on their own before.
        return Acks(last, [e.tag for e in single], self.rounds)

    def confirmed(self, ack_round: int) -> None:
        """The broker processed every round up to ``ack_round``."""
        acked, recent = self.acked, self.recent
        while acked and acked[0].round <= ack_round:
            entry = acked.popleft()
            if recent.maxlen:
                recent.append(entry)

    def settled(self, committed: int) -> bool:
        """Every committed delivery is acked and the broker has proven it."""
        return not self.acked and all(e.owner == UNPLANNED or e.owner > committed or e.acked for e in self.unacked)

    def unproven(self, committed: int) -> Iterator[int]:
        """Batches that own a committed delivery whose ack the broker has not yet been proven to process."""
        for entry in self.acked:
            yield entry.owner
        for entry in self.unacked:
            if entry.owner != UNPLANNED and entry.owner <= committed and not entry.acked:
                yield entry.owner

    def owned(self) -> Iterator[Entry]:
        """Entries a batch owns that the broker may still redeliver."""
        yield from self.recent
        yield from self.acked
        for entry in self.unacked:
            if entry.owner != UNPLANNED and not entry.acked:
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
    Unplanned deliveries are counted for every fingerprint, owned or not, so that
    a return the filter expects is never taken for something else: with a journal,
    ``copies`` looks a redelivery the filter knows nothing of up among what the live
    channels delivered, and two returned messages of one content must both pass.
    """

    def __init__(self, retention_seconds: float = 1800.0, by: str = "messageId") -> None:
        self.retention = retention_seconds
        self.by = by
        # Lists, not deques: a lost channel's whole window of fingerprints is held for the retention, nearly all with
        # one owner, and an empty deque costs 600 bytes against a list's 56.
        self._owners: dict[tuple[str, Fingerprint], list[int]] = {}
        self._pass: dict[tuple[str, Fingerprint], int] = {}
        self._expiry: dict[tuple[str, Fingerprint], float] = {}
        self._per_owner: Counter[int] = Counter()

    def session_lost(self, owned: list[Entry], unplanned: list[Entry]) -> None:
        self.expect(((e.delivery.queue, fingerprint(e.delivery, self.by)), e.owner) for e in owned)
        expires = time.monotonic() + self.retention
        for entry in unplanned:
            key = (entry.delivery.queue, fingerprint(entry.delivery, self.by))
            self._pass[key] = self._pass.get(key, 0) + 1
            self._expiry[key] = expires

    def expect(self, copies: Iterable[tuple[tuple[str, Fingerprint], int]]) -> None:
        """Copies that may come back redelivered, each ``((queue, fingerprint), owning batch)``."""
        expires = time.monotonic() + self.retention
        for key, owner in copies:
            self._owners.setdefault(key, []).append(owner)
            self._expiry[key] = expires
            self._per_owner[owner] += 1

    def match(self, delivery: Delivery) -> int | None:
        """The owning batch of a redelivered copy, consuming one occurrence; None if it is to be emitted."""
        owner = self.judge(delivery)
        return None if owner == RETURNED else owner

    def judge(self, delivery: Delivery) -> int | None:
        """As ``match``, but RETURNED for one of a lost channel's unplanned deliveries (emitted, and not to be taken
        for a copy of anything else), None for a redelivery the filter expects nothing of."""
        if not self._owners and not self._pass:
            return None
        key = (delivery.queue, fingerprint(delivery, self.by))
        passing = self._pass.get(key)
        if passing:
            if passing > 1:
                self._pass[key] = passing - 1
            else:
                del self._pass[key]
                if key not in self._owners:
                    self._expiry.pop(key, None)
            return RETURNED
        owners = self._owners.get(key)
        if not owners:
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

    @property
    def expecting(self) -> bool:
        """Whether any copy may still come back."""
        return bool(self._owners)

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
        """Returns still expected: copies to drop and unplanned deliveries to emit."""
        return sum(len(v) for v in self._owners.values()) + sum(self._pass.values())
