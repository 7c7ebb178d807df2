"""Ack frontier and redelivery counting, without a broker."""

from __future__ import annotations

import collections

import pika

from spark_amqp.queues.inbox import Delivery
from spark_amqp.queues.ledger import RETURNED, UNPLANNED, Acks, Entry, RedeliveryFilter, SessionLedger, fingerprint


def _d(tag: int, body: bytes = b"same", message_id: str | None = None, redelivered: bool = False, session: str = "s.1") -> Delivery:
    return Delivery(session, "q", tag, redelivered, "", "q", pika.BasicProperties(message_id=message_id), body)


def _entry(tag: int, owner: int, **kw) -> Entry:  # type: ignore[no-untyped-def]
    e = Entry(tag, _d(tag, **kw))
    e.owner = owner
    return e


def test_frontier_stops_at_the_first_uncommitted_or_unplanned_delivery() -> None:
    ledger = SessionLedger()
    for tag, owner in [(1, 1), (2, 1), (3, 2), (4, UNPLANNED), (5, 1)]:
        ledger.add(_entry(tag, owner))
    assert ledger.next_acks(0) is None
    assert ledger.next_acks(1) == Acks(2, [], 1)
    assert ledger.next_acks(2) == Acks(3, [], 2)
    assert ledger.next_acks(5) is None  # tag 4 is not planned: nothing beyond it is acked
    assert [e.tag for e in ledger.owned()] == [1, 2, 3, 5]
    ledger.confirmed(1)
    assert [e.tag for e in ledger.acked] == [3]


def test_with_a_journal_owned_entries_behind_an_unplanned_one_are_acked_on_their_own() -> None:
    # The journal holds every owned entry, so each may be acked at once; the frontier's
    # multi-ack never names a tag acked on its own (RabbitMQ: 406 unknown delivery tag).
    ledger = SessionLedger()
    entries = {tag: _entry(tag, UNPLANNED) for tag in range(1, 7)}
    for entry in entries.values():
        ledger.add(entry)
    ledger.claim(entries[1], 1)
    ledger.claim(entries[3], 2)  # a copy of a journalled batch's message, behind unplanned 2
    ledger.claim(entries[4], 2)
    held = 10**9
    assert ledger.next_acks(held, singles=True) == Acks(1, [3, 4], 1)
    assert ledger.next_acks(held, singles=True) is None  # nothing new
    ledger.claim(entries[2], 3)
    assert ledger.next_acks(held, singles=True) == Acks(2, [], 2)  # not 4: it was acked on its own
    assert [e.tag for e in ledger.acked] == [1, 3, 4, 2]
    ledger.confirmed(1)
    assert [e.tag for e in ledger.acked] == [2]
    ledger.claim(entries[6], 4)
    assert ledger.next_acks(held, singles=True) == Acks(None, [6], 3)
    ledger.claim(entries[5], 4)
    assert ledger.next_acks(held, singles=True) == Acks(5, [], 4)  # 5, not 6
    ledger.confirmed(4)
    assert ledger.settled(4) and not list(ledger.owned())


def test_without_a_journal_nothing_is_acked_on_its_own() -> None:
    ledger = SessionLedger()
    first, copy = _entry(1, UNPLANNED), _entry(2, UNPLANNED)
    ledger.add(first)
    ledger.add(copy)
    ledger.claim(copy, 1)
    assert ledger.next_acks(1) is None  # the multi-ack waits for the unplanned delivery before it
    ledger.claim(first, 2)
    assert ledger.next_acks(1) is None and ledger.next_acks(2) == Acks(2, [], 1)


def test_fingerprint_prefers_message_id_and_ignores_quorum_return_counts() -> None:
    assert fingerprint(_d(1, message_id="abc")) == ("id", "abc")
    # A first delivery (4.x stamps nothing; 3.10 stamped x-delivery-count 0 on basic.get) and
    # redeliveries as 3.10/4.0 (x-delivery-count) and 4.3 (also x-acquired-count) stamp them.
    first = Delivery("s", "q", 1, False, "", "q", pika.BasicProperties(headers={"k": 1}), b"x")
    copies = [
        Delivery("s", "q", 9, True, "", "q", pika.BasicProperties(headers=h), b"x")
        for h in (
            {"k": 1, "x-delivery-count": 0},
            {"k": 1, "x-delivery-count": 3},
            {"k": 1, "x-acquired-count": 1},
            {"k": 1, "x-acquired-count": 4, "x-delivery-count": 2},
        )
    ]
    other = Delivery("s", "q", 9, True, "", "q", pika.BasicProperties(headers={"k": 2}), b"x")
    assert {fingerprint(d) for d in [first, *copies]} == {fingerprint(first)} and fingerprint(other) != fingerprint(first)
    for by in ("messageId", "content"):  # with an id too, when content is what counts
        with_id = [
            Delivery(d.session, d.queue, d.tag, d.redelivered, "", "q", pika.BasicProperties(message_id="m", headers=d.props.headers), b"x")
            for d in (first, *copies)
        ]
        assert len({fingerprint(d, by) for d in with_id}) == 1


def _emitted(filt: RedeliveryFilter, copies: int) -> int:
    return sum(filt.match(_d(100 + i, redelivered=True, session="s.2")) is None for i in range(copies))


def test_identical_copies_ack_processed_before_the_drop() -> None:
    # 10 acked (proof pending) + 20 unplanned; the broker did process the ack: 20 come back.
    filt = RedeliveryFilter()
    filt.session_lost([_entry(t, 1) for t in range(1, 11)], [_entry(t, UNPLANNED) for t in range(11, 31)])
    assert _emitted(filt, 20) == 20


def test_identical_copies_ack_lost_with_the_connection() -> None:
    # Same, but the ack never reached the broker: all 30 come back, 20 are new.
    filt = RedeliveryFilter()
    filt.session_lost([_entry(t, 1) for t in range(1, 11)], [_entry(t, UNPLANNED) for t in range(11, 31)])
    assert _emitted(filt, 30) == 20
    assert _emitted(filt, 5) == 5  # the filter is used up: later copies are new messages


def test_message_ids_match_exactly() -> None:
    filt = RedeliveryFilter()
    filt.session_lost([_entry(1, 3, message_id="a")], [_entry(2, UNPLANNED, message_id="b")])
    assert filt.match(_d(7, message_id="b", redelivered=True)) is None
    assert filt.match(_d(8, message_id="a", redelivered=True)) == 3
    assert filt.match(_d(9, message_id="a", redelivered=True)) is None


def test_every_unplanned_return_is_counted_to_pass() -> None:
    # Two waiting messages of one content, none of it planned: both returns are the filter's, emitted and looked up no
    # further (with a journal LiveCopies would otherwise take the second for a copy of the first), then it forgets them.
    filt = RedeliveryFilter()
    filt.session_lost([], [_entry(1, UNPLANNED), _entry(2, UNPLANNED), _entry(3, UNPLANNED, body=b"other")])
    assert [filt.judge(_d(10 + i, redelivered=True, session="s.2")) for i in range(3)] == [RETURNED, RETURNED, None]
    assert filt.match(_d(13, body=b"other", redelivered=True, session="s.2")) is None  # emitted, as before
    assert len(filt) == 0 and filt.judge(_d(14, body=b"other", redelivered=True, session="s.2")) is None


def test_entries_expire() -> None:
    filt = RedeliveryFilter(retention_seconds=-1)
    filt.session_lost([_entry(1, 1)], [])
    filt.expire()
    assert len(filt) == 0 and filt.match(_d(5, redelivered=True)) is None


def test_deliveries_after_a_session_loss_in_the_same_pump_are_kept() -> None:
    """Regression: a lost session and the next session's deliveries drained together."""
    from spark_amqp.queues.inbox import SessionClosed
    from spark_amqp.queues.options import parse_source_options
    from spark_amqp.queues.runtime import SourceRuntime

    class FakeSession:
        marks_redeliveries = True

        def __init__(self) -> None:
            self.inbox: collections.deque = collections.deque()  # type: ignore[type-arg]
            self.acks: list[tuple[str, int]] = []

        def ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
            self.acks.append((session, multiple))

        def check(self) -> None:
            pass

    runtime = SourceRuntime(parse_source_options({"uri": "amqp://h/", "queue": "q"}))
    fake = FakeSession()
    runtime.session = fake  # type: ignore[assignment]
    fake.inbox.extend(_d(t, body=b"%d" % t, session="s.1") for t in range(1, 4))
    runtime._pump()
    fake.inbox.append(SessionClosed("s.1", "q", "dropped"))
    fake.inbox.extend(_d(t, body=b"%d" % t, redelivered=True, session="s.2") for t in range(1, 4))
    fake.inbox.append(_d(4, body=b"new", session="s.2"))
    end = runtime.latest_offset(None, None)
    assert end["queues"]["q"] == {"session": "s.2", "tag": 4}
    rows = [e.delivery.body for e in runtime.ledgers["s.2"].unacked]
    assert rows == [b"1", b"2", b"3", b"new"] and not runtime.buffer
    runtime.latest_offset(end, None)  # the batch is committed by now
    assert fake.acks == [("s.2", 4)]


def test_available_now_waits_for_data_instead_of_ending_the_run() -> None:
    """Regression: returning the start offset ends a Trigger.AvailableNow run early."""
    import threading

    from spark_amqp.queues.available_now import AvailableNow
    from spark_amqp.queues.options import parse_source_options
    from spark_amqp.queues.runtime import SourceRuntime

    class FakeSession:
        inbox: collections.deque = collections.deque()  # type: ignore[type-arg]
        marks_redeliveries = True

        def ack(self, session: str, multiple: int | None, singles: list[int], ack_round: int) -> None:
            pass

        def check(self) -> None:
            pass

    runtime = SourceRuntime(parse_source_options({"uri": "amqp://h/", "queue": "q"}))
    fake = FakeSession()
    runtime.session = fake  # type: ignore[assignment]
    runtime.available_now = AvailableNow({"q": 2}, runtime.options.connection, "test")
    threading.Timer(0.3, lambda: fake.inbox.extend([_d(1), _d(2)])).start()
    end = runtime.latest_offset(None, None)
    assert end["queues"]["q"]["tag"] == 2
    assert runtime.latest_offset(end, None) == end  # target reached: now the run may end


def test_a_shared_id_is_credited_to_the_newest_batch_so_it_is_not_acked_before_that_batch_commits() -> None:
    # Two messages with one id: one in committed batch 3 (ack sent, not yet proven),
    # one in batch 5 (planned, not committed). The channel dies; the broker did
    # process batch 3's ack, so the one copy that comes back is batch 5's message.
    filt = RedeliveryFilter()
    filt.session_lost([_entry(1, 3, message_id="dup"), _entry(2, 5, message_id="dup")], [])
    owner = filt.match(_d(9, message_id="dup", redelivered=True, session="s.2"))
    assert owner == 5
    # On the new channel that copy is acked with its owner: not while only batch 3 is committed.
    ledger = SessionLedger()
    copy = Entry(1, _d(1, message_id="dup", redelivered=True, session="s.2"))
    copy.owner = owner
    ledger.add(copy)
    assert ledger.next_acks(3) is None
    assert ledger.next_acks(5) == Acks(1, [], 1)
    # The second copy (if batch 3's ack was lost after all) goes to batch 3.
    assert filt.match(_d(10, message_id="dup", redelivered=True, session="s.2")) == 3
