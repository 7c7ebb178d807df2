"""``read_range``'s loop, without a broker: a jump in the offsets that arrives as the loop winds down, in
the same callbacks that end the range, must still be checked before the task ends."""

from __future__ import annotations

from typing import Any

import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.reading import arrow
from spark_amqp.streams import range_reader
from spark_amqp.streams.options import parse_stream_options
from spark_amqp.streams.range_base import RangeReader
from spark_amqp.streams.ranges import StreamRange


class _Access:
    def __init__(self, head: int) -> None:
        self._head = head

    async def head(self, client: Any, stream: str) -> int:
        return self._head


class _LateJump(RangeReader):
    """Offsets 0-4 arrive at once; then, after next_rows has returned its rows, offset 150 arrives (the
    loop runs a few more callbacks): retention removed 5-99 while the task was not reading."""

    jumped = False

    async def _connect(self) -> None:
        self.client = object()
        self.access = _Access(100)  # type: ignore[assignment]

    async def _subscribe(self) -> None:
        self.subscribed = True
        for offset in range(5):
            if self._offered(offset):
                self.rows.append((b"", self.part.stream, "", "", offset, None))
        self.arrived.set()

    async def _unsubscribe(self) -> None:
        self.subscribed = False

    async def close(self) -> None:
        self.client = None

    async def next_rows(self, limit: int) -> list[Any]:
        rows = await super().next_rows(limit)
        if not self.jumped:
            self.jumped = True
            self._offered(150)  # past the range's end too: it ends the range
        return rows


@pytest.mark.parametrize("fail_on_data_loss", [True, False], ids=["fail", "skip"])
def test_a_jump_in_the_callbacks_that_end_the_range_is_still_checked(monkeypatch, caplog, fail_on_data_loss: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(range_reader, "AmqpRangeReader", _LateJump)
    monkeypatch.setattr(arrow, "to_stream_batch", lambda rows, *_: [r[4] for r in rows])  # a "batch" is its offsets
    opts = parse_stream_options(
        {"uri": "amqp://guest:guest@127.0.0.1:1/%2F", "stream": "s", "failOnDataLoss": str(fail_on_data_loss).lower()}
    )
    batches = range_reader.read_range(opts, StreamRange("s", 0, 120), 5)
    assert next(batches) == [0, 1, 2, 3, 4]
    if fail_on_data_loss:
        with pytest.raises(AmqpSourceError, match=r"stream 's': offsets 5 to 99 \(95\) were removed"):
            next(batches)
    else:
        assert list(batches) == []
        assert "offsets 5 to 99 (95) were removed" in caplog.text and "skipped (failOnDataLoss=false)" in caplog.text
