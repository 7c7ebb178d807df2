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

So, with a journal, a redelivery on a live channel that the redelivery filter
expects nothing of is looked up among what this reader's live channels
delivered: a batch's own message is dropped as a copy and acknowledged with that
batch, and one still waiting in the buffer gives its place to the copy (the
broker ignores the old tag's ack). The queue has at most ``prefetch`` messages
checked out to a consumer, so the channel's last ``prefetch`` proven acks
(``SessionLedger.recent``) are enough to look in. The look-up index is built at
the first such redelivery and dropped once redeliveries stop, so a reader that
sees none pays nothing. Each delivery is repeated once at most: a copy found
takes its original's place, to be found in turn if the queue sends the message
once more (seen in CI, where two partitions 60 s apart made a query read 400
ids twice).

Which deliveries may be originals. A redelivery is either a message the queue
returned before the channel began consuming, or a copy of a delivery the channel
had. The first kind comes from a channel of this reader that ended, and then the
redelivery filter has counted it, or from before this run (a crashed run's
messages, another application's returns). The filter decides first: a copy of a
planned delivery is dropped, a return of an unplanned one is emitted and looked
up no further, so that two returned messages of one content both come out. The
consumer is exclusive, so nothing else returns messages while it reads, and a
queue sends what was returned before anything it never delivered: once a queue
has sent this run a first delivery (not redelivered), every return from before
the run has come, and a redelivery the filter does not expect is a copy. So a
delivery with a message id may be an original (the id names one message), a
first delivery may, and by content any delivery of a queue that has sent this
run a first delivery may: the copies the filter found and the returns it let
through, so the queue's next return of them is dropped too. By content, the
returns a run gets before its queue's first delivery may not: two of one content
may be two messages of an earlier run. Counting stays a multiset's: per content,
the filter's counts decide first, and what they leave over is copies.

What remains: a message without an id that a run got back from an earlier run
(or another application) before its queue sent it anything new, and that the
queue then sends again on the same channel, comes out twice. Only with a
journal: there the consumer is exclusive, so a redelivery on a live channel can
only be such a copy, whereas without one another application sharing the queue
may return a message whose content equals one this reader acked.
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
        self._fresh: set[str] = set()  # queues that sent this run a first delivery

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

    def settled(self, redelivery: Entry) -> None:
        """What became of ``redelivery`` is decided (a copy, or a message to emit): the queue may send it again."""
        if self._index is not None and self._may_repeat(redelivery):
            self._add(redelivery)

    def noted(self, entry: Entry) -> None:
        """A new delivery: indexed while redeliveries come (a redelivery only once ``settled``), the index dropped when
        they have stopped."""
        delivery = entry.delivery
        if not delivery.redelivered and delivery.queue not in self._fresh:
            self._fresh.add(delivery.queue)
            self._index = None  # that queue's redeliveries may be originals now: rebuilt at the next look-up
        if self._index is None:
            return
        self._since_match += 1
        if delivery.redelivered:
            return
        if self._since_match > 2 * self.window:
            self.reset()
            return
        self._add(entry)

    def reset(self) -> None:
        """A channel ended: its deliveries are the redelivery filter's now."""
        self._index = None
        self._size = 0

    def _may_repeat(self, entry: Entry) -> bool:
        delivery = entry.delivery
        if not delivery.redelivered or delivery.queue in self._fresh:
            return True
        return self.by == "messageId" and bool(delivery.props.message_id)

    def _build(self, copy: Entry, ledgers: Iterable[SessionLedger]) -> None:
        self._index, self._size = {}, 0
        for ledger in ledgers:
            for entry in (*ledger.recent, *ledger.acked, *ledger.unacked):
                if entry is not copy and entry.owner >= UNPLANNED and self._may_repeat(entry):
                    self._add(entry)

    def _add(self, entry: Entry) -> None:
        assert self._index is not None
        self._index.setdefault(self._key(entry.delivery), []).append(entry)
        self._size += 1
