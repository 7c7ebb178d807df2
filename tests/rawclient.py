"""A minimal blocking AMQP client on raw sockets, for the edge cases pika refuses to produce."""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from typing import Any

from pamqp import commands, frame, header, heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


class RawClient:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self.user = urllib.parse.unquote(parts.username or "guest")
        self.password = urllib.parse.unquote(parts.password or "guest")
        self.sock = socket.create_connection((parts.hostname, parts.port or 5672), timeout=timeout)
        self.buf = b""
        self.frame_max = 131072

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, value: Any) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def recv_raw(self, timeout: float = 5.0) -> bytes:
        """Everything the peer sends until it closes the socket or goes quiet."""
        self.sock.settimeout(timeout)
        out = self.buf
        self.buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out

    def read_frame(self, timeout: float = 5.0) -> tuple[int, Any]:
        """Next (channel, frame); raises EOFError when the peer closed the socket."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack(">I", self.buf[3:7])[0]
                if len(self.buf) >= size + 8:
                    consumed, channel, value = frame.unmarshal(self.buf)
                    self.buf = self.buf[consumed:]
                    return channel, value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as err:
                raise EOFError from err
            if not chunk:
                raise EOFError("peer closed")
            self.buf += chunk

    def read_raw_frame(self, timeout: float = 5.0) -> tuple[int, int, bytes]:
        """Next (type, channel, payload) without decoding; heartbeats are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = struct.unpack(">BHI", self.buf[:7])
                if len(self.buf) >= size + 8:
                    payload = self.buf[7 : 7 + size]
                    self.buf = self.buf[size + 8 :]
                    if ftype == 8:
                        continue
                    return ftype, channel, payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("peer closed")
            self.buf += chunk

    def read_method(self, timeout: float = 5.0) -> tuple[int, Any]:
        while True:
            channel, value = self.read_frame(timeout)
            if not isinstance(value, heartbeat.Heartbeat):
                return channel, value

    def handshake(
        self, heartbeat_s: int = 0, frame_max: int = 131072, channel_max: int = 2047, vhost: str = "/"
    ) -> commands.Connection.Tune:
        self.sock.sendall(PROTOCOL_HEADER)
        _, start = self.read_method()
        assert isinstance(start, commands.Connection.Start), start
        response = f"\0{self.user}\0{self.password}"
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"consumer_cancel_notify": True}}, mechanism="PLAIN", response=response, locale="en_US"
            ),
        )
        _, tune = self.read_method()
        assert isinstance(tune, commands.Connection.Tune), tune
        self.frame_max = frame_max
        self.send(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat_s))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        return tune

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        _, ok = self.read_method()
        assert isinstance(ok, commands.Channel.OpenOk), ok

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes, **props: Any) -> None:
        raw = header.ContentHeader(0, len(body), commands.Basic.Properties(**props)).marshal()
        self.publish_raw_header(channel, exchange, routing_key, raw, body)

    def publish_raw_header(self, channel: int, exchange: str, routing_key: str, raw_header: bytes, body: bytes) -> None:
        self.send(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
        self.sock.sendall(frame._marshal(2, channel, raw_header))
        if body:
            self.sock.sendall(frame._marshal(3, channel, body))
