"""Spark stops a streaming query by sending its source-runner process SIGTERM.

Left to the default action, the process dies with its connection half-open and the
broker holds the batch's unacked deliveries until it notices, which can take a
heartbeat interval or more. So in the runner the first SIGTERM first gives the
deliveries back and closes the connection, then dies of the signal as before:
the exit status Spark expects is unchanged.

Python runs the handler in the main thread only, when that thread next runs
bytecode, and the runner's main thread spends its life blocked in a socket read.
The kernel may hand the process's signal to any thread that does not block it
(pyarrow's own threads block nothing), and then the main thread's read is never
interrupted: in one CI run of 70 here, the runner outlived its SIGTERM by more
than 90 s with no signal pending. So a watcher thread, woken through Python's
wakeup fd in whichever thread the signal landed, sends it on to the main thread.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["in_source_runner", "shut_down_first"]

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def in_source_runner() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == RUNNER_MODULE


def shut_down_first(shutdown: Callable[[], None]) -> None:
    """On SIGTERM: ``shutdown()`` once, then the default action. Call from the main thread."""
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
    _forward_to_main_thread()


def _forward_to_main_thread() -> None:
    """A thread that sends the process's first SIGTERM on to the main thread, where it interrupts a blocked read."""
    if not hasattr(signal, "pthread_kill"):
        return  # Windows: no signal reaches a thread there
    woken, wakeup = socket.socketpair()
    wakeup.setblocking(False)
    taken = signal.set_wakeup_fd(wakeup.fileno(), warn_on_full_buffer=False)
    if taken != -1:  # an earlier call's, or another library's: it stays (nothing in PySpark's runner sets one)
        signal.set_wakeup_fd(taken)
        woken.close()
        wakeup.close()
        return
    main = threading.main_thread().ident
    assert main is not None

    def watch(woken: socket.socket, wakeup: socket.socket) -> None:
        """Runs for the process's life, holding ``wakeup`` open: closed with its last reference, every write would fail."""
        forwarded = False
        while signums := woken.recv(64):
            if signal.SIGTERM in signums and not forwarded:
                # Once: the one sent on wakes this thread too. The handler ignores it while it shuts down, dies of it after.
                forwarded = True
                signal.pthread_kill(main, signal.SIGTERM)

    # Daemon: the process ends when the runner's main thread does.
    threading.Thread(target=watch, args=(woken, wakeup), name="spark-amqp sigterm", daemon=True).start()
