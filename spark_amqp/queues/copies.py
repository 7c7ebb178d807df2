"""``LiveCopies``: messages a quorum queue sends again on a channel that is still open.

When a quorum queue's leader loses touch with the node a consumer's channel is
on (a network partition), it takes the consumer for gone and returns every
message checked out to it, acks it had not applied included. Once the node is
back, the consumer is too, and the same channel gets those messages again,
marked redelivered, under new delivery tags. Measured on RabbitMQ 4.3.6 (a
3-node cluster, the consumer on the cut-off node, 2026-11-28): every message
delivered before the cut, acked and proven acked then, came again after the heal
with ``redelivered`` set and ``x-acquired-count`` 1. A proven ack is one the
channel took, not one the queue applied.

So, with a journal, a redelivered delivery on a live channel is looked up among
what this reader's live channels delivered: a batch's own message is dropped as
a copy and acknowledged with that batch, and one still waiting in the buffer
gives its place to the copy (the broker ignores the old tag's ack). The queue
has at most ``prefetch`` messages checked out to a consumer, so the channel's
last ``prefetch`` proven acks (``SessionLedger.recent``) are enough to look in.
The look-up index is built at the first redelivery and dropped once redeliveries
stop, so a reader that sees none pays nothing. Only first deliveries are looked
up, and the copies found of them: after a crash every delivery of the new channel
is redelivered, and two identical messages among them (no message id) are two
messages, not a copy. A copy found takes its original's place in the index, so a
message the queue returns again (a second partition, with the copy acked or in
the buffer) is found once more: seen in CI, where two partitions 60 s apart made
a query read 400 ids twice, copies the first partition had sent. A copy the
redelivery filter found after a lost channel does the same if it has a message
id; without one it does not (a message of the same content could be another),
so such a message returned again on the live channel comes out twice. Only with
a journal: there the consumer is exclusive, so a redelivery on a live channel
can only be such a copy, whereas without one another application sharing the
queue may return a message whose content equals one this reader acked.
"""

from __future__ import annotations

from collections.abc import Iterable

from .inbox import Delivery
from .ledger import UNPLANNED, Entry, Fingerprint, SessionLedger, fingerprint

Key = tuple[str, Fingerprint]


class LiveCopies:
    def __init__(self, by: str, window: int) -> None:
        self.by = by
        self.window = max(window, 1)
        self._index: dict[Key, list[Entry]] | None = None
        self._size = 0
        self._since_match = 0

    def _key(self, delivery: Delivery) -> Key:
        return (delivery.queue, fingerprint(delivery, self.by))

    def original(self, copy: Entry, ledgers: Iterable[SessionLedger]) -> Entry | None:
        """The delivery ``copy`` repeats, taken out of the index (each original is repeated once), or None."""
        if self._index is None or self._size > 4 * self.window:
            self._build(copy, ledgers)
        assert self._index is not None
        self._since_match = 0
        candidates = self._index.get(self._key(copy.delivery))
        if not candidates:
            return None
        # Dead-lettered and superseded deliveries repeat nothing any more. A batch's own message comes first (the
        # newest batch, as in RedeliveryFilter): dropping the copy leaves the buffer as it is.
        live = [i for i, e in enumerate(candidates) if e.owner >= UNPLANNED]
        if not live:
            return None
        chosen = max(live, key=lambda i: candidates[i].owner)
        original = candidates.pop(chosen)
        self._size -= 1
        return original

    def found(self, copy: Entry, by_filter: bool = False) -> None:
        """``copy`` repeats a delivery this reader had: it stands in for it if the queue returns the message once more.
        One the redelivery filter found (a channel was lost) only by message id: after a crash, two messages of the
        same content and no id are two messages, and the filter's counts alone keep both."""
        if by_filter and self._key(copy.delivery)[1][0] != "id":
            return
        copy.copy = True
        if self._index is not None:
            self._add(copy)

    def noted(self, entry: Entry) -> None:
        """A new delivery: indexed while redeliveries come (a redelivered one is no original: not indexed), the index
        dropped when they have stopped."""
        if self._index is None:
            return
        self._since_match += 1
        if entry.delivery.redelivered:
            return
        if self._since_match > 2 * self.window:
            self.reset()
            return
        self._add(entry)

    def reset(self) -> None:
        """A channel ended: its deliveries are the redelivery filter's now."""
        self._index = None
        self._size = 0

    def _build(self, copy: Entry, ledgers: Iterable[SessionLedger]) -> None:
        self._index, self._size = {}, 0
        for ledger in ledgers:
            for entry in (*ledger.recent, *ledger.acked, *ledger.unacked):
                if entry is not copy and entry.owner >= UNPLANNED and (entry.copy or not entry.delivery.redelivered):
                    self._add(entry)

    def _add(self, entry: Entry) -> None:
        assert self._index is not None
        self._index.setdefault(self._key(entry.delivery), []).append(entry)
        self._size += 1
