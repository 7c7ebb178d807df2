"""A raw-frame client for streams, for what pika hides: the order of frames on the wire
(deliveries before a barrier's reply), the exact encoding of a header value, and a burst
of publishes written in one send (which RabbitMQ's stream writer turns into large chunks);
``burst`` writes one with stream filter values."""

from __future__ import annotations

from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header
from spark_amqp_broker.codec import decode_properties

from spark_amqp.framing import decode_method

from ..rawclient import RawClient

C = commands
TIMEOUT = 15.0
FILTER = "x-stream-filter-value"


class StreamClient(RawClient):
    """Logged in, with channel 1 open."""

    def __init__(self, url: str) -> None:
        super().__init__(url, timeout=TIMEOUT)
        self.handshake()
        _, ok = self.read_method(TIMEOUT)
        assert isinstance(ok, C.Connection.OpenOk), ok
        self.open_channel(1)

    def expect(self, cls: type) -> Any:
        while True:
            _, value = self.read_method(TIMEOUT)
            if isinstance(value, cls):
                return value
            if isinstance(value, C.Connection.Close | C.Channel.Close):
                raise AssertionError(f"closed: {value.reply_code} {value.reply_text}")

    def publish_burst(self, queue: str, bodies: list[bytes], headers: list[dict[str, Any] | None] | None = None) -> None:
        """All publishes in one write, confirmed, so the broker sees them at once (with ``headers``, one table
        or None per message)."""
        self.send(1, C.Confirm.Select())
        self.expect(C.Confirm.SelectOk)
        out = []
        for i, data in enumerate(bodies):
            props = C.Basic.Properties(headers=headers[i] if headers else None)
            out.append(frame.marshal(C.Basic.Publish(exchange="", routing_key=queue), 1))
            out.append(frame.marshal(header.ContentHeader(0, len(data), props), 1))
            out.append(frame.marshal(pbody.ContentBody(data), 1))
        self.sock.sendall(b"".join(out))
        acked = 0
        while acked < len(bodies):
            acked = self.expect(C.Basic.Ack).delivery_tag

    def consume_then_cancel(self, queue: str, offset: Any, prefetch: int, tag: str = "t", wait: float = 1.0) -> list[tuple[int, bytes]]:
        """The (offset, raw content header) of what a consumer from ``offset`` with ``prefetch``
        gets without acking, then basic.cancel.

        RabbitMQ reads nothing while it handles basic.consume: a stream consumer's first
        deliveries follow consume-ok, usually at once, later when the log is busy (see
        spark_amqp/stream/probe.py). So this waits up to ``wait`` for the first delivery (none
        in that time: nothing to read), then sends basic.qos as a barrier: whatever the channel
        read in the same go is on the wire before its qos-ok. RabbitMQ 3.10.8 can crash the
        connection (541, ``badkey`` in ``rabbit_channel:consumer_monitor``) when a cancel for a
        stream consumer is sent before its consume-ok arrived: never pipeline the two.
        """
        self.send(1, C.Basic.Qos(prefetch_count=prefetch))
        self.expect(C.Basic.QosOk)
        self.send(1, C.Basic.Consume(queue=queue, consumer_tag=tag, arguments={"x-stream-offset": offset}))
        got: list[tuple[int, bytes]] = []
        consuming = barrier = False
        while True:
            try:
                kind, _, payload = self.read_raw_frame(wait if consuming and not got and not barrier else TIMEOUT)
            except TimeoutError:
                kind, payload = 0, b""  # no first delivery within `wait`
            if kind == 2:
                got.append((int(decode_properties(payload).headers["x-stream-offset"]), payload))
            elif kind == 1:
                method = decode_method(payload)
                if isinstance(method, C.Basic.ConsumeOk):
                    consuming = True
                    continue
                if isinstance(method, C.Basic.QosOk):
                    self.send(1, C.Basic.Cancel(consumer_tag=tag))
                elif isinstance(method, C.Basic.CancelOk):
                    return got
                elif isinstance(method, C.Connection.Close | C.Channel.Close):
                    raise AssertionError(f"closed: {method.reply_code} {method.reply_text}")
            if consuming and not barrier and (got or kind == 0):
                barrier = True
                self.send(1, C.Basic.Qos(prefetch_count=prefetch))

    def close(self) -> None:
        try:
            self.send(0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            self.expect(C.Connection.CloseOk)
        finally:
            super().close()


def burst(url: str, q: str, values: list[str | None]) -> None:
    """One confirmed write (a chunk, or a few, of its own) of messages with these filter values (None: none);
    their bodies are the values ('-' for none)."""
    raw = StreamClient(url)
    try:
        raw.publish_burst(q, [(v or "-").encode() for v in values], [None if v is None else {FILTER: v} for v in values])
    finally:
        raw.close()
