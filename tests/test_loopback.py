"""The check that keeps the tests' Spark on loopback (``tests/loopback.py``) finds a listener that is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from .loopback import is_loopback, listening, not_on_loopback


def test_a_listener_on_every_interface_is_found_and_one_on_loopback_passes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as local, socket.create_server(("0.0.0.0", 0)) as everywhere:
        mine = {(address, port) for pid, address, port in listening(os.getpid()) if pid == os.getpid()}
        assert ("127.0.0.1", local.getsockname()[1]) in mine
        assert ("0.0.0.0", everywhere.getsockname()[1]) in mine
        assert (os.getpid(), "0.0.0.0", everywhere.getsockname()[1]) in not_on_loopback(os.getpid())
        assert all(port != local.getsockname()[1] for _, _, port in not_on_loopback(os.getpid()))


def test_a_child_listening_on_ipv6_everywhere_is_found() -> None:
    # A JVM listens on IPv6 sockets, and a Spark Connect server on every interface unless told: [::].
    script = "import socket,sys; s=socket.create_server(('::', 0), family=socket.AF_INET6); print(s.getsockname()[1], flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert (child.pid, "::", port) in not_on_loopback(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_loopback_addresses() -> None:
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"))
