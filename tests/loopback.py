"""Where a process and its children listen: the TCP sockets in state LISTEN they hold, read from /proc.

Every Spark the tests start must listen on loopback only (docs/development.md, "Loopback and free ports"): on a
machine whose hostname resolves to 127.0.0.1, Spark otherwise binds its driver to the external interface, and a Spark
Connect server to every interface. ``tests/test_loopback.py`` shows this finds a listener that is not on loopback;
``tests/spark/test_loopback.py`` and the Spark Connect servers of ``tests/spark/connect_server.py`` use it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

_LISTEN = "0A"  # the state column of /proc/net/tcp


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Spark's Python workers and daemons, a launcher's JVM)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:  # ended, or not ours to read
        pass
    return inodes


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` (IPv4) or 32 hex digits (IPv6): /proc writes each 32-bit word in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listening(pid: int) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in state LISTEN that ``pid`` or a process below it holds."""
    owners = {inode: p for p in descendants(pid) for inode in _socket_inodes(p)}
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in owners:
                address, port = local.rsplit(":", 1)
                found.append((owners[inode], _address(address), int(port, 16)))
    return sorted(found)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None  # a JVM's IPv4 sockets: ::ffff:a.b.c.d
    return (mapped or ip).is_loopback


def not_on_loopback(pid: int) -> list[tuple[int, str, int]]:
    """The listeners of ``pid`` and its children on another address than loopback (a wildcard included)."""
    return [entry for entry in listening(pid) if not is_loopback(entry[1])]
