"""The Artemis tests run one at a time, whichever worker runs them: two of them restart the broker the others use."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def one_at_a_time() -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / "spark-amqp-artemis-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
