"""A blocking AMQP client on raw frames, for what pika hides: the order of frames on the
wire (deliveries before cancel-ok), the exact encoding of a header value, and a burst of
publishes written in one send (which RabbitMQ's stream writer turns into large chunks)."""

from __future__ import annotations

import socket
import struct
import urllib.parse
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

C = commands


class RawClient:
    def __init__(self, url: str, timeout: float = 15.0) -> None:
        parts = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=timeout)
        self.timeout = timeout
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(C.Connection.Start)
        user, password = urllib.parse.unquote(parts.username or "guest"), urllib.parse.unquote(parts.password or "guest")
        self.send(0, C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=f"\0{user}\0{password}"))
        tune = self.expect(C.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self.send(0, C.Connection.Open(virtual_host="/"))
        self.expect(C.Connection.OpenOk)
        self.send(1, C.Channel.Open())
        self.expect(C.Channel.OpenOk)

    def send(self, channel: int, method: Any) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def read(self) -> tuple[int, Any, bytes]:
        """The next frame: (channel, pamqp frame object, its raw payload)."""
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0]
                if len(self.buf) >= size + 8:
                    payload = self.buf[7 : 7 + size]
                    consumed, channel, value = frame.unmarshal(self.buf)
                    self.buf = self.buf[consumed:]
                    return channel, value, payload
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("connection closed by the broker")
            self.buf += data

    def expect(self, cls: type) -> Any:
        while True:
            _, value, _ = self.read()
            if isinstance(value, cls):
                return value
            if isinstance(value, C.Connection.Close | C.Channel.Close):
                raise AssertionError(f"closed: {value.reply_code} {value.reply_text}")

    def publish_burst(self, queue: str, bodies: list[bytes]) -> None:
        """All publishes in one write, confirmed, so the broker sees them at once."""
        self.send(1, C.Confirm.Select())
        self.expect(C.Confirm.SelectOk)
        out = []
        for data in bodies:
            out.append(frame.marshal(C.Basic.Publish(exchange="", routing_key=queue), 1))
            out.append(frame.marshal(header.ContentHeader(0, len(data), C.Basic.Properties()), 1))
            out.append(frame.marshal(pbody.ContentBody(data), 1))
        self.sock.sendall(b"".join(out))
        acked = 0
        while acked < len(bodies):
            ack = self.expect(C.Basic.Ack)
            acked = ack.delivery_tag

    def consume_then_cancel(self, queue: str, offset: Any, prefetch: int, tag: str = "t") -> list[tuple[int, bytes]]:
        """basic.consume, and basic.cancel once consume-ok came; the (offset, raw content
        header) of every delivery that came before cancel-ok.

        RabbitMQ 3.10.8 can crash the connection (541, ``badkey`` in
        ``rabbit_channel:consumer_monitor``) when a cancel for a stream consumer is sent
        before its consume-ok arrived: never pipeline the two.
        """
        self.send(1, C.Basic.Qos(prefetch_count=prefetch))
        self.expect(C.Basic.QosOk)
        self.send(1, C.Basic.Consume(queue=queue, consumer_tag=tag, arguments={"x-stream-offset": offset}))
        got: list[tuple[int, bytes]] = []
        cancelled = False
        while True:
            _, value, payload = self.read()
            if isinstance(value, header.ContentHeader):
                got.append((int(value.properties.headers["x-stream-offset"]), payload))
            elif isinstance(value, C.Basic.ConsumeOk) and not cancelled:
                self.send(1, C.Basic.Cancel(consumer_tag=tag))
                cancelled = True
            elif isinstance(value, C.Basic.CancelOk):
                return got
            elif isinstance(value, C.Connection.Close | C.Channel.Close):
                raise AssertionError(f"closed: {value.reply_code} {value.reply_text}")

    def close(self) -> None:
        try:
            self.send(0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            self.expect(C.Connection.CloseOk)
        finally:
            self.sock.close()
