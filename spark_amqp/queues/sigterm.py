"""Spark stops a streaming query by sending its source-runner process SIGTERM.

Left to the default action, the process dies with its connection half-open and the
broker holds the batch's unacked deliveries until it notices, which can take a
heartbeat interval or more. So in the runner the first SIGTERM first gives the
deliveries back and closes the connection, then dies of the signal as before:
the exit status Spark expects is unchanged.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["in_source_runner", "shut_down_first"]

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def in_source_runner() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == RUNNER_MODULE


def shut_down_first(shutdown: Callable[[], None]) -> None:
    """On SIGTERM: ``shutdown()`` once, then the default action."""
    terminating = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal terminating
        if terminating:
            return
        terminating = True
        try:
            shutdown()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
