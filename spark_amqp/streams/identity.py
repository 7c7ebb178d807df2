"""``Identities``: whether a stream is still the one a query's offsets were taken from.

A stream deleted and declared again starts over at offset 0. While it is shorter
than the query's position, the planner's "ends before the position" check finds
it; once it has grown past, only the messages tell. So every batch end carries a
mark of the message before it (``offset.mark_of``), and a position this process
did not plan itself is checked against the broker once before it is used: after
a restart, and after the broker cancelled a stream's tail watcher or the
planner's connection was replaced (the stream may have gone in between).

The mark comes from the tail probe's last message when a batch reads to the end,
and from one probe at the batch's last offset when it stops short of it. A
message that retention has removed cannot be checked, nor can a position
without a mark (where the query starts, or a checkpoint written before marks);
both go unchecked, as docs/streams.md says.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..client.blocking import BlockingClient
from ..errors import AmqpSourceError
from .access import BrokerAccess, Watch
from .offset import StreamOffset, mark_of

__all__ = ["Identities"]

log = logging.getLogger("spark_amqp.streams")


class Identities:
    def __init__(self, client: BlockingClient[Any], access: BrokerAccess, tails: Watch, fail_on_data_loss: bool) -> None:
        self.client = client
        self.access = access
        self.tails = tails
        self.fail_on_data_loss = fail_on_data_loss
        self._checked: set[tuple[str, int, str]] = set()  # (stream, position, mark) known to hold
        self._warned: set[tuple[str, int]] = set()
        self._absent: set[tuple[str, int]] = set()  # (stream, position) whose message before was not there, logged

    def check(self, offset: StreamOffset, streams: tuple[str, ...], retry_for: float | None = None) -> None:
        """Every marked position of ``offset`` that this process has not planned or checked, against the
        message the broker holds before it. A different message fails the query (``failOnDataLoss``)."""
        for stream in self.tails.take_suspects():
            self._checked = {c for c in self._checked if c[0] != stream}
        for stream, mark in offset.marks:
            position = offset.get(stream)
            if stream not in streams or (stream, position, mark) in self._checked:
                continue
            body = self._body_at(stream, position - 1, retry_for)
            if body is None:
                # Gone to retention, or the stream now ends before it (which planning waits out, see ``shortfall``):
                # nothing to compare now. Asked again next time: a member catching up holds it once it has.
                if (stream, position) not in self._absent:
                    self._absent.add((stream, position))
                    log.info(
                        "AMQP source: stream '%s' holds no message at offset %d now; its identity is not checked", stream, position - 1
                    )
                continue
            if mark_of(body) != mark:
                self._declared_again(stream, position)
            self._checked.add((stream, position, mark))

    def marks_for(self, ends: Mapping[str, int], origin: StreamOffset) -> dict[str, str]:
        """The mark of each new end: a position that did not move keeps its own; the tail probe's when a
        batch reads to the measured end; else one probe at the batch's last offset (none if the broker
        cannot be asked now: a mark is a check, never a reason to stop planning)."""
        marks: dict[str, str] = {}
        for stream, end in ends.items():
            if end == origin.get(stream):
                kept = origin.mark(stream)
            elif end == self.tails.ends.get(stream):
                kept = self.tails.marks.get(stream)
            else:
                kept = self._probe_mark(stream, end)
            if kept is not None and end > 0:
                marks[stream] = kept
                self._checked.add((stream, end, kept))
        return marks

    def _probe_mark(self, stream: str, end: int) -> str | None:
        try:
            body = self._body_at(stream, end - 1, 0.0)
        except AmqpSourceError as err:
            log.info("AMQP source: no mark for stream '%s' at offset %d: %s", stream, end, err)
            return None
        return None if body is None else mark_of(body)

    def _body_at(self, stream: str, offset: int, retry_for: float | None) -> bytes | None:
        """The body of the message at exactly ``offset``; None if the stream holds none there now."""
        found = self.client.run(lambda c: self.access.message_at(c, stream, offset), f"stream '{stream}'", retry_for)
        return found[1] if found is not None and found[0] == offset else None

    def _declared_again(self, stream: str, position: int) -> None:
        message = (
            f"stream '{stream}' holds another message at offset {position - 1} than when this query read it: the "
            f"stream was deleted and declared again, and the new one has grown past this query's position ({position})"
        )
        if self.fail_on_data_loss:
            raise AmqpSourceError(
                message + ". Start the query with a new checkpointLocation to read the new stream from its start, "
                "or set failOnDataLoss=false to read it on from this position"
            )
        if (stream, position) not in self._warned:
            self._warned.add((stream, position))
            log.warning(
                "AMQP source: %s; reading it on from offset %d (failOnDataLoss=false): its offsets before that are never read",
                message,
                position,
            )
