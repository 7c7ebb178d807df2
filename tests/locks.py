"""One test at a time across pytest-xdist's workers and test runs on this machine, for tests that share a broker they
stop or restart (the 3-node cluster, ActiveMQ Artemis): a file lock in the temporary folder, by name."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / f"spark-amqp-{name}-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
