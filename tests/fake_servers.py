"""Fake brokers on loopback for the connection and sink tests: a node that accepts and never answers (optionally
behind TLS), a node that comes back after a while in front of a real one, and a self-signed certificate made by
openssl."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest


class Listener:
    """Accepts connections on a free loopback port until closed; ``accepted`` handles each."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted(conn)

    def accepted(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


class SilentServer(Listener):
    """Accepts connections and never answers (a node that is hung, or behind a firewall that drops); records the
    TLS server name each client asked for, and when a client closes its socket."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.names: list[str | None] = []
        self.closed_by_client = threading.Event()
        super().__init__()

    def accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                self.tls.sni_callback = lambda _sock, name, _ctx: self.names.append(name)  # type: ignore[assignment,misc]
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:  # the client refused the handshake: it did not close a connection
                    return
            conn.settimeout(30)
            try:
                while conn.recv(1024):
                    pass
            except OSError:
                pass
            self.closed_by_client.set()  # EOF or a reset: the client closed its end
        finally:
            conn.close()


def self_signed(directory: Path, name: str, alt_name: str | None = None) -> tuple[Path, Path]:
    """A certificate for CN ``name`` (and DNS ``alt_name``) and its key, valid for a day; skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    extra = ("-addext", f"subjectAltName=DNS:{alt_name}") if alt_name else ()
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}"),
            *extra,
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class LateNode(Listener):
    """A node that comes back: for ``down`` seconds each connection is closed as soon as it is accepted (a node
    restarting), then each is forwarded to ``port``, so that a client reaches a real broker late."""

    def __init__(self, port: int, down: float) -> None:
        self.target = port
        self.up_at = time.monotonic() + down
        self.refused = 0
        super().__init__()

    def accepted(self, conn: socket.socket) -> None:
        if time.monotonic() < self.up_at:
            self.refused += 1
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.target))
        for source, sink in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
