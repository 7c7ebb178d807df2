"""Raw pika clients the benchmarks measure against: the rates to beat.

- ``publish_async``: SelectConnection keeping a window of outstanding confirms.
- ``publish_sync``: BlockingConnection, one synchronous confirm per message.
- ``consume``: SelectConnection with a prefetch and a multi-ack every ``ack_every``; on a stream
  queue with consumer arguments (``x-stream-offset``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pika


def publish_async(
    url: str,
    queue: str,
    count: int,
    body: bytes | Callable[[int], bytes],
    window: int = 1000,
    properties: Callable[[int], pika.BasicProperties] | None = None,
) -> float:
    """Seconds to publish ``count`` messages with ``window`` unconfirmed at most (``body`` and ``properties`` of the
    i-th message, when they are callables)."""
    state = {"sent": 0, "confirmed": 0, "nacked": 0}
    conn_box: list[pika.SelectConnection] = []

    def pump(ch: pika.channel.Channel) -> None:
        while state["sent"] < count and state["sent"] - state["confirmed"] < window:
            i = state["sent"]
            ch.basic_publish("", queue, body if isinstance(body, bytes) else body(i), None if properties is None else properties(i))
            state["sent"] += 1

    def on_confirm(frame: pika.frame.Method) -> None:
        m = frame.method
        if m.multiple:
            state["confirmed"] = m.delivery_tag
        else:
            state["confirmed"] += 1
        if isinstance(m, pika.spec.Basic.Nack):
            state["nacked"] += 1
        if state["confirmed"] >= count:
            conn_box[0].close()
        else:
            pump(frame_channel[0])

    frame_channel: list[pika.channel.Channel] = []

    def on_channel(ch: pika.channel.Channel) -> None:
        frame_channel.append(ch)
        ch.confirm_delivery(on_confirm, callback=lambda _: pump(ch))

    conn = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, r: c.ioloop.stop(),
    )
    conn_box.append(conn)
    start = time.perf_counter()
    conn.ioloop.start()
    elapsed = time.perf_counter() - start
    if state["confirmed"] < count or state["nacked"]:
        raise RuntimeError(f"async publisher: {state}")
    return elapsed


def publish_sync(url: str, queue: str, count: int, body: bytes) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    start = time.perf_counter()
    for _ in range(count):
        ch.basic_publish("", queue, body)
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def consume(
    url: str,
    queue: str,
    count: int,
    prefetch: int = 1000,
    ack_every: int = 1000,
    arguments: dict[str, object] | None = None,
    keep: Callable[[pika.BasicProperties], bool] | None = None,
) -> float:
    """Seconds to consume and multi-ack ``count`` messages (with ``keep``: until ``count`` were kept).

    On a stream queue pass ``arguments={"x-stream-offset": ...}``: acks only give credit back
    there, so ``ack_every`` must stay below ``prefetch``.
    """
    state = {"got": 0, "kept": 0}

    def on_message(ch: pika.channel.Channel, method: pika.spec.Basic.Deliver, props: pika.BasicProperties, body: bytes) -> None:
        state["got"] += 1
        if keep is None or keep(props):
            state["kept"] += 1
        if state["got"] % ack_every == 0 or state["kept"] == count:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if state["kept"] == count:
            ch.connection.close()

    def on_channel(ch: pika.channel.Channel) -> None:
        ch.basic_qos(prefetch_count=prefetch, callback=lambda _: ch.basic_consume(queue, on_message, arguments=arguments))

    conn = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda c, r: c.ioloop.stop(),
    )
    start = time.perf_counter()
    conn.ioloop.start()
    elapsed = time.perf_counter() - start
    if state["kept"] != count:
        raise RuntimeError(f"consumer got {state['kept']} of {count}")
    return elapsed


def declare(url: str, queue: str, **kwargs: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, **kwargs)
    conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def embedded_broker_process() -> Iterator[tuple[str, int]]:
    """The embedded broker in a process of its own, as RabbitMQ would be: (url, pid)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_amqp_broker", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    deadline = time.monotonic() + 20
    while True:
        try:
            pika.BlockingConnection(pika.URLParameters(url)).close()
            break
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)
    try:
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
