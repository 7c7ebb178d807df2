"""``Intake``: what the consumer session hands over, sorted into what the source runtime needs.

Deliveries go into each channel's ``SessionLedger`` and, unless they are a
redelivered copy of a message a batch already holds (``RedeliveryFilter``),
into the buffer a batch is taken from. A channel that ended takes its unplanned
deliveries with it (they come back redelivered) and leaves its owned ones to the
filter. With a journal, a redelivery on a live channel that the filter expects
nothing of is also looked up among what the live channels delivered
(``LiveCopies``). Redeliveries that a quorum queue counts towards its
delivery-limit (``x-delivery-count``, stamped from the first return on) are
reported: the runtime journals them at once, or, without a journal, fails
before the broker can drop them.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from .copies import LiveCopies
from .inbox import AckConfirmed, Delivery, SessionClosed
from .ledger import APART, RETURNED, SINGLE, SUPERSEDED, UNPLANNED, Entry, RedeliveryFilter, SessionLedger

log = logging.getLogger("spark_amqp.queues")

RETURNS_HEADER = "x-delivery-count"


def returns(delivery: Delivery) -> int:
    """How often a quorum queue counts this message as returned (its ``x-delivery-count``), 0 if never."""
    props: Any = delivery.props
    reader = getattr(props, "long_header", None)  # absent on pika's BasicProperties (tests)
    value = reader(RETURNS_HEADER) if reader is not None else (props.headers or {}).get(RETURNS_HEADER)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class Intake:
    def __init__(self, redelivery: RedeliveryFilter, window: int = 0) -> None:
        """``window``: with a journal, the prefetch: how many proven acks of a channel a live copy may repeat."""
        self.buffer: deque[Entry] = deque()  # deliveries no batch holds yet, in arrival order
        self.ledgers: dict[str, SessionLedger] = {}
        self.dead_sessions: set[str] = set()
        self.filter = redelivery
        self.window = window
        self.live_copies = LiveCopies(redelivery.by, window) if window else None
        self.copies_dropped = 0
        self.sessions_lost = 0
        self.most_returns: dict[str, int] = {}  # queue -> highest x-delivery-count seen (the progress shows it)

    def take(self, inbox: deque[Delivery | SessionClosed | AckConfirmed], unmarked: bool = False) -> tuple[list[Entry], bool]:
        """Everything in ``inbox``; (returned deliveries that are not copies, whether an ack round was proven).

        ``unmarked``: the broker does not mark every redelivery (ActiveMQ Artemis over AMQP 1.0 sends a delivery-count
        of 1 only after some lost connections, none after a release, a detach or a clean close): then every delivery
        is checked against the copies the filter expects, while it expects any."""
        buffer = self.buffer
        ledgers = self.ledgers
        filt = self.filter
        live = self.live_copies
        returned: list[Entry] = []
        superseded: set[Entry] = set()
        proven = False
        while inbox:
            item = inbox.popleft()
            if type(item) is Delivery:
                sid = item.session
                ledger = ledgers.get(sid)
                if ledger is None:
                    if sid in self.dead_sessions:
                        continue
                    ledger = ledgers[sid] = SessionLedger(self.window)
                entry = Entry(item.tag, item)
                ledger.add(entry)
                if live is not None:
                    live.noted(entry)
                if item.redelivered or (unmarked and filt.expecting):
                    owner = filt.judge(item)
                    if owner is None and live is not None and item.redelivered:
                        original = live.original(entry, ledgers.values())
                        if original is not None and original.owner == UNPLANNED:
                            self.claim([original], SUPERSEDED)  # the copy takes its place in the buffer
                            superseded.add(original)
                        elif original is not None:
                            owner = original.owner
                    if live is not None and item.redelivered:
                        live.settled(entry)
                    if owner is not None and owner != RETURNED:
                        ledger.claim(entry, owner)
                        self.copies_dropped += 1
                        continue
                    count = returns(item) if item.redelivered else 0
                    if count:
                        if count > self.most_returns.get(item.queue, 0):
                            self.most_returns[item.queue] = count
                        returned.append(entry)
                buffer.append(entry)
            elif isinstance(item, SessionClosed):
                self._session_closed(item)
                if returned:
                    # Its returned deliveries come back once more on the next session: reporting these too
                    # journalled each message once per session lost between two pumps.
                    returned = [e for e in returned if e.delivery.session != item.session]
            elif isinstance(item, AckConfirmed):
                ledger = ledgers.get(item.session)
                if ledger is not None:
                    ledger.confirmed(item.round)
                    proven = True
        if superseded:
            self.keep_only(lambda e: e not in superseded)
            returned = [e for e in returned if e not in superseded]
            self.copies_dropped += len(superseded)
        filt.expire()
        return returned, proven

    def _session_closed(self, event: SessionClosed) -> None:
        self.sessions_lost += 1
        self.dead_sessions.add(event.session)
        if self.live_copies is not None:
            self.live_copies.reset()
        ledger = self.ledgers.pop(event.session, None)
        # Unplanned deliveries of the dead channel come back as redeliveries.
        unplanned = [e for e in self.buffer if e.delivery.session == event.session]
        if unplanned:
            self.keep_only(lambda e: e.delivery.session != event.session)
        if ledger is not None:
            self.filter.session_lost(list(ledger.owned()), unplanned)
        log.info("AMQP source: session %s (queue '%s') ended: %s", event.session, event.queue, event.reason)

    def keep_only(self, keep: Any) -> None:
        """Drop buffered entries ``keep`` refuses, in place (callers hold this deque)."""
        kept = [e for e in self.buffer if keep(e)]
        self.buffer.clear()
        self.buffer.extend(kept)

    def set_apart(self, entries: list[Entry]) -> None:
        """Entries settled on their own outside any batch (dead-lettered): out of the buffer, and passed by the ack
        frontier without being acknowledged."""
        apart = set(entries)
        self.keep_only(lambda e: e not in apart)
        for entry in entries:
            entry.owner, entry.acked = APART, SINGLE

    def claim(self, entries: list[Entry], owner: int) -> None:
        for entry in entries:
            ledger = self.ledgers.get(entry.delivery.session)
            if ledger is not None:
                ledger.claim(entry, owner)
            else:
                entry.owner = owner  # its channel ended: its copies are the filter's now
