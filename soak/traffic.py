"""The soak's traffic outside Spark: producers that keep the queue and the stream fed, a feeder that keeps the sinks'
input directory fed, and drainers that take what the AMQP sinks publish. Each goes on through the faults by
reconnecting (to the next node) and keeps what it needs to count losses and duplicates afterwards."""

from __future__ import annotations

import array
import collections
import functools
import itertools
import json
import threading
import time
from pathlib import Path

import pika

RECONNECT_PAUSE = 1.0  # seconds between attempts: the faults last tens of seconds
# A publish not confirmed by then is given up on, its connection dropped and the id sent again through the next node.
# A node cut off from the others answers heartbeats but confirms nothing until the partition heals: the soak of
# 2026-11-28 had its stream producer wait on such a confirm from minute 14 to the end (docs/soak.md).
CONFIRM_TIMEOUT = 30.0


class ConfirmTimeout(pika.exceptions.AMQPConnectionError):
    """No confirm within CONFIRM_TIMEOUT: the connection is dropped as pika drops one whose heartbeats stopped."""


def _connect(url: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    # A short heartbeat: the traffic feeding the queries must find a silent node sooner than the queries do, or
    # the queries' pauses would be the input's.
    params.heartbeat, params.socket_timeout, params.blocked_connection_timeout = 3, 5, 60
    params.connection_attempts = 1
    return pika.BlockingConnection(params)


class Producer(threading.Thread):
    """Publishes ids ``<prefix>0``, ``<prefix>1``, … to ``queue`` at ``rate`` a second, each confirmed before the
    next. A publish whose outcome is unknown (the connection lost before its confirm, a nack, no confirm within
    CONFIRM_TIMEOUT) is sent again: such an id is in ``resent``, as it may be in the queue twice."""

    def __init__(self, urls: list[str], queue: str, prefix: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.urls, self.queue, self.prefix, self.rate = urls, queue, prefix, rate
        self.confirmed: set[str] = set()
        self.confirmed_at = array.array("d")  # wall clock of each confirm, for the input's own pauses
        self.resent: set[str] = set()
        self.errors: collections.Counter[str] = collections.Counter()
        self.stopping = threading.Event()
        self._connection: pika.BlockingConnection | None = None
        self._waiting_since: float | None = None  # monotonic time of the publish waiting for its confirm

    def run(self) -> None:
        threading.Thread(target=self._watch, daemon=True).start()
        nodes = itertools.cycle(self.urls)
        n, began = 0, time.monotonic()
        while not self.stopping.is_set():
            try:
                self._connection = _connect(next(nodes))
                channel = self._connection.channel()
                channel.confirm_delivery()
                while not self.stopping.is_set():
                    message_id = f"{self.prefix}{n}"
                    props = pika.BasicProperties(message_id=message_id, delivery_mode=2)
                    self._waiting_since = time.monotonic()
                    channel.basic_publish("", self.queue, message_id.encode(), props, mandatory=True)
                    self._waiting_since = None
                    self.confirmed.add(message_id)
                    self.confirmed_at.append(time.time())
                    n += 1
                    self.stopping.wait(max(0.0, began + n / self.rate - time.monotonic()))
                channel.connection.close()
            except Exception as err:  # counted; the id is sent again on the next connection
                self._waiting_since = None
                self.errors[type(err).__name__] += 1
                self.resent.add(f"{self.prefix}{n}")
                self.stopping.wait(RECONNECT_PAUSE)

    def _watch(self) -> None:
        """Drops the connection of a publish that waited CONFIRM_TIMEOUT for its confirm. basic_publish blocks in
        the publishing thread, and pika runs no callback of ours meanwhile: the drop goes through the connection's
        own thread-safe hook, as its heartbeat checker's does, and basic_publish raises ConfirmTimeout."""
        while not self.stopping.wait(1.0):
            since, connection = self._waiting_since, self._connection
            if since is not None and connection is not None and time.monotonic() - since > CONFIRM_TIMEOUT:
                error = ConfirmTimeout(f"no confirm within {CONFIRM_TIMEOUT:.0f} s")
                impl = connection._impl
                impl._adapter_add_callback_threadsafe(functools.partial(impl._terminate_stream, error))
                self._waiting_since = None  # once per publish

    def pause(self, within: tuple[float, float]) -> float:
        """The longest time without a confirm around ``within``: the input's own pause."""
        at = self.confirmed_at
        gaps = [b - a for a, b in itertools.pairwise(at) if b >= within[0] and a <= within[1]]
        return max(gaps, default=0.0)


class Feeder(threading.Thread):
    """Writes the sinks' input: a JSON file of ``per_file`` rows (ids ``k0``, ``k1``, …) every ``per_file / rate``
    seconds, each file whole before it is visible (written beside, then renamed)."""

    def __init__(self, rows: Path, rate: float, per_file: int = 100) -> None:
        super().__init__(daemon=True)
        self.rows, self.rate, self.per_file = rows, rate, per_file
        self.fed = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        self.rows.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for f in itertools.count():
            if self.stopping.wait(max(0.0, began + f * self.per_file / self.rate - time.monotonic())):
                return
            ids = range(self.fed, self.fed + self.per_file)
            tmp = self.rows.parent / f".{f}.json"
            tmp.write_text("".join(json.dumps({"body": f"k{i}", "message_id": f"k{i}"}) + "\n" for i in ids))
            tmp.rename(self.rows / f"{f:06d}.json")
            self.fed += self.per_file


class Drainer(threading.Thread):
    """Consumes ``queue`` (acking after counting), so an AMQP sink's output neither grows without bound nor is lost
    to the count; an id redelivered after a lost connection is counted again, as the sink's duplicates are."""

    def __init__(self, urls: list[str], queue: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.queue = urls, queue
        self.got: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        nodes = itertools.cycle(self.urls)
        while not self.stopping.is_set():
            try:
                channel = _connect(next(nodes)).channel()
                channel.basic_qos(prefetch_count=500)
                for method, props, _ in channel.consume(self.queue, inactivity_timeout=1):
                    if self.stopping.is_set():
                        break
                    if method is not None:
                        self.got[props.message_id] += 1
                        channel.basic_ack(method.delivery_tag)
                channel.connection.close()
            except Exception as err:  # counted; it reconnects, and what was not acked comes again
                self.errors[type(err).__name__] += 1
                self.stopping.wait(RECONNECT_PAUSE)


def stream_ids(url: str, stream: str) -> collections.Counter[str]:
    """Every message id in ``stream`` from its first offset, counted."""
    channel = _connect(url).channel()
    channel.basic_qos(prefetch_count=1000)
    got: collections.Counter[str] = collections.Counter()
    for method, props, _ in channel.consume(stream, arguments={"x-stream-offset": "first"}, inactivity_timeout=5):
        if method is None:
            break
        got[props.message_id] += 1
        channel.basic_ack(method.delivery_tag)
    channel.connection.close()
    return got
