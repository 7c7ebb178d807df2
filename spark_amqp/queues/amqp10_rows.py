"""AMQP 1.0 deliveries of one queue to what the I/O thread hands over: body, exchange, routing key, properties.

A delivery needs its redelivered flag, exchange and routing key as it arrives (the ledger and the redelivery filter
read them); its property columns only when a batch is made, in the runner's thread. So only the header and the
message annotations are decoded on arrival, and a queue's deliveries mostly repeat those bytes (RabbitMQ's
first-delivery header, the exchange and routing key), so each distinct pair is decoded once. The sections before the
body wait in ``LazySections``: a batch's property columns come from them in one call to the compiled core
(``reading.core_properties``), or from Python's ``RowMaker.properties``, which gives the same values. Producer-like
messages (their own ids, timestamp and application properties) used to cost the source runner 69 µs each, decoded
in Python as they arrived, against 26 for one with a body alone (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from ..stream_protocol.rows import Conversion, RowMaker, StreamProperties, sized

__all__ = ["LazySections", "QueueRows"]


class LazySections(StreamProperties):
    """A delivery's properties, decoded from ``key`` (its sections before the body) when first asked for."""

    __slots__ = ("_maker",)

    def __init__(self, key: bytes, maker: RowMaker, redelivered: bool) -> None:
        super().__init__(key, None, redelivered)  # type: ignore[arg-type]
        self._maker = maker

    @property
    def core_sections(self) -> bytes:
        """The sections for the compiled core to decode: never changed, decoded or not."""
        return self.key

    @property
    def conversion(self) -> Conversion:
        return self._maker.conversion

    def arrow_row(self) -> tuple[Any, ...]:
        columns = self.columns
        if columns is None:
            columns = self.columns = self._maker.properties(self.key)
        return columns


class QueueRows:
    """Deliveries of ``queue`` from a broker that converts as ``conversion`` says, as (body, exchange, routing key,
    properties). A message whose body is not one data section after sections sized as usual (an amqp-value body,
    several data sections) is decoded whole on arrival, as a stream's record is (``RowMaker.row``)."""

    CACHE = 1024

    def __init__(self, queue: str, conversion: Conversion) -> None:
        self._maker = RowMaker(queue, conversion)
        self._heads: dict[bytes, tuple[str, str, bool]] = {}

    def row(self, message: bytes) -> tuple[bytes, str, str, StreamProperties]:
        start, body, head = sized(message)
        if body is None or not start:
            whole, _, exchange, key, _, props = self._maker.row(message, 0)
            return whole, exchange, key, props
        known = self._heads.get(head)
        if known is None:
            if len(self._heads) >= self.CACHE:
                self._heads.clear()
            known = self._heads[head] = self._maker.route(head)
        return body, known[0], known[1], LazySections(message[:start], self._maker, known[2])
