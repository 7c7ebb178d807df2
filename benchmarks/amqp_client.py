"""Our AMQP 0-9-1 client against aiormq and raw pika, side by side on one broker: why spark-amqp has its own client.

    .venv/bin/python benchmarks/amqp_client.py [--url amqp://guest:guest@127.0.0.1:5690/%2F] [--messages 100000] [--rounds 3]

aiormq (mosquito/aiormq) is the other asyncio client on pamqp. It is no dependency of the project: install the
version measured, ``.venv/bin/python -m pip install aiormq==7.2.4``, to run this. Without ``--url`` the embedded
broker runs in a process of its own (as in the other benchmarks), so this process holds only the clients.

On one durable classic queue, ``--rounds`` rounds, each client in turn (the first one rotates from round to round):

- consume: ``--messages`` x 200 B preloaded with pika before each run, then read with prefetch 1000 and one
  multi-ack every 1000 deliveries. Ours as the source reads (``queues/session.py``): an ``AmqpClient`` channel whose
  delivery callback makes the ``Delivery`` tuple the session hands its runner thread and queues it; here the callback
  itself acks and drops each 1000 (the session's runner thread does that, through ``call_soon_threadsafe``). aiormq:
  ``basic_consume`` with a callback acking with ``basic_ack(multiple=True)``. pika: ``pika_baseline.consume``.
- publish: ``--messages`` x 200 B, persistent, in confirm mode with at most 1000 unconfirmed. Ours through the sink's
  own ``PartitionPublisher`` (one prebuilt ``Outgoing``: no Arrow rows to convert; mandatory off like the others).
  aiormq: 1000 coroutines, each awaiting the confirm of its own ``basic_publish`` before the next (aiormq answers
  each publish with its own future). pika: ``pika_baseline.publish_async``. The queue must then hold every message.

A rate counts from connect to close, as pika_baseline's do. The client's CPU per message is this process's
``time.process_time``; the broker's, from /proc, when its process is known (the embedded broker, or the local
process listening on ``--url``'s port). ``--profile`` then runs each client once more under cProfile.

What limits it: the broker and the client share the machine (2 cores here), so a rate is bound by both and moves
with whatever else runs; the client's CPU per message is the steadier figure. One connection, one channel.
aiormq's rate is its default ``basic_publish`` (``wait=True``: each publish also waits for the socket's drain;
``wait=False``, tried once on the embedded broker, still took 114 us of CPU a message).

Measured (aiormq 7.2.4, pika 1.4.4, pamqp 4.0.1, Python 3.11, 2 cores shared with other jobs; 7 runs of 3 rounds on
the embedded broker, RabbitMQ 4.3.6 and 3.10.8): our client spends 3-8 us of CPU per message, pika 12-24, aiormq 58-86
consuming and 114-189 publishing; ours reads 2.6-11x and publishes 2.6-12x aiormq's rate. Per delivery aiormq awaits three
``readexactly`` (one per frame), decodes every frame and its properties with pamqp, passes each frame through a
channel queue to a reader task and starts a task per delivery (~360 Python calls a message under cProfile; ours ~20:
one ``data_received`` slices whole deliveries with ``struct``, properties decoded only when asked). Per publish it
turns the event loop three times (a write queue, a writer task, drain and confirm futures; ~560 calls, ours ~36), so
messages trickle in: RabbitMQ 4.3 confirms 2-2.5 of them a frame (ours: 11-66) and spends 2-5x the CPU per message.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from importlib.metadata import version as version_of
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aiormq
import pika
import pika_baseline as pb
from machine import listening_pid
from pamqp import commands, header

from spark_amqp import framing
from spark_amqp.client import AmqpClient, LazyProperties
from spark_amqp.queues.inbox import Delivery
from spark_amqp.sink.columns import Outgoing
from spark_amqp.sink.options import SinkOptions, parse_sink_options
from spark_amqp.sink.publisher import PartitionPublisher

BODY = b"x" * 200
QUEUE = "bench.amqp-client"
WINDOW = 1000  # unconfirmed publishes at most
PREFETCH = 1000
ACK_EVERY = 1000
CLIENTS = ("ours", "aiormq", "pika")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- ours ---------------------------------------------------------------------------------------------


def sink_options(url: str, queue: str) -> SinkOptions:
    return parse_sink_options({"uri": url, "routingKey": queue, "maxInFlight": str(WINDOW), "mandatory": "false"})


async def ours_publish(url: str, queue: str, count: int) -> None:
    message = Outgoing(
        framing.shortstr(""),
        framing.shortstr(queue),
        header.ContentHeader(0, len(BODY), commands.Basic.Properties(delivery_mode=2)).marshal(),
        BODY,
    )
    result = await PartitionPublisher(sink_options(url, queue)).publish([[message] * count], "benchmark")
    if result.confirmed != count:
        raise RuntimeError(f"ours: {result.confirmed} of {count} confirmed")


async def ours_consume(url: str, queue: str, count: int) -> None:
    client = await AmqpClient.connect(sink_options(url, queue).connection, "benchmark consumer")
    try:
        channel = await client.channel()
        await channel.rpc(commands.Basic.Qos(prefetch_count=PREFETCH))
        done = asyncio.get_running_loop().create_future()
        inbox: deque[Delivery] = deque()
        taken = [0]
        make = tuple.__new__  # as the session makes a Delivery

        def on_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: LazyProperties, body: bytes) -> None:
            inbox.append(make(Delivery, ("bench.1", queue, tag, redelivered, exchange, routing_key, props, body)))
            if len(inbox) == ACK_EVERY or taken[0] + len(inbox) == count:
                channel.ack(tag, True)
                taken[0] += len(inbox)
                inbox.clear()
                if taken[0] == count:
                    done.set_result(None)

        channel.on_delivery = on_delivery
        await channel.rpc(framing.build(commands.Basic.Consume, queue=queue, consumer_tag="benchmark"))
        await done
    finally:
        await client.close()


# -- aiormq -------------------------------------------------------------------------------------------


async def aiormq_publish(url: str, queue: str, count: int) -> None:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)

        async def publisher(n: int) -> None:
            for _ in range(n):
                # A Properties per message: aiormq writes a message_id into the one it is given.
                confirm = await channel.basic_publish(BODY, routing_key=queue, properties=commands.Basic.Properties(delivery_mode=2))
                if not isinstance(confirm, commands.Basic.Ack):
                    raise RuntimeError(f"aiormq: {confirm!r}")

        shares = [count // WINDOW + (i < count % WINDOW) for i in range(WINDOW)]
        await asyncio.gather(*(publisher(n) for n in shares if n))
    finally:
        await connection.close()


async def aiormq_consume(url: str, queue: str, count: int) -> None:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=PREFETCH)
        done = asyncio.get_running_loop().create_future()
        got = [0]

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            got[0] += 1
            last = got[0] == count
            if got[0] % ACK_EVERY == 0 or last:
                assert message.delivery_tag is not None
                await channel.basic_ack(message.delivery_tag, multiple=True)
            if last:
                done.set_result(None)

        await channel.basic_consume(queue, on_message)
        await done
    finally:
        await connection.close()


# -- runs -------------------------------------------------------------------------------------------------

PIKA_PERSISTENT = pika.BasicProperties(delivery_mode=2)


def publish(client: str, url: str, queue: str, count: int) -> None:
    if client == "ours":
        asyncio.run(ours_publish(url, queue, count))
    elif client == "aiormq":
        asyncio.run(aiormq_publish(url, queue, count))
    else:
        pb.publish_async(url, queue, count, BODY, window=WINDOW, properties=lambda _: PIKA_PERSISTENT)


def consume(client: str, url: str, queue: str, count: int) -> None:
    if client == "ours":
        asyncio.run(ours_consume(url, queue, count))
    elif client == "aiormq":
        asyncio.run(aiormq_consume(url, queue, count))
    else:
        pb.consume(url, queue, count, prefetch=PREFETCH, ack_every=ACK_EVERY)


def declare(url: str, queue: str) -> None:
    pb.declare(url, queue, durable=True, arguments={"x-queue-type": "classic"})


def ready(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def expect(url: str, queue: str, count: int, what: str) -> None:
    """The queue holds ``count`` messages (waited for up to 5 s), or the run does not count."""
    deadline = time.monotonic() + 5
    while (held := ready(url, queue)) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: the queue holds {held} messages, not {count}")
        time.sleep(0.1)


def preload(url: str, queue: str, count: int) -> None:
    declare(url, queue)
    pb.publish_async(url, queue, count, BODY, window=2000, properties=lambda _: PIKA_PERSISTENT)
    expect(url, queue, count, "preload")


def broker_ticks(pid: int | None) -> int:
    """utime + stime of the broker's process, 0 when unknown."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Sample(NamedTuple):
    rate: float  # msg/s
    cpu_us: float  # this process's CPU per message
    broker_us: float  # the broker's CPU per message (0 when its process is unknown)


def timed(run: Callable[[], None], count: int, broker: int | None) -> Sample:
    ticks, cpu, start = broker_ticks(broker), time.process_time(), time.perf_counter()
    run()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    ticks = broker_ticks(broker) - ticks
    return Sample(count / elapsed, cpu / count * 1e6, ticks / CLOCK_TICKS / count * 1e6)


def consume_run(client: str, url: str, count: int, broker: int | None) -> Sample:
    preload(url, QUEUE, count)
    sample = timed(lambda: consume(client, url, QUEUE, count), count, broker)
    expect(url, QUEUE, 0, f"{client} consume")
    return sample


def publish_run(client: str, url: str, count: int, broker: int | None) -> Sample:
    declare(url, QUEUE)
    sample = timed(lambda: publish(client, url, QUEUE, count), count, broker)
    expect(url, QUEUE, count, f"{client} publish")
    return sample


def report(test: str, samples: dict[str, list[Sample]]) -> None:
    mean = {c: Sample(*(statistics.mean(field) for field in zip(*s, strict=True))) for c, s in samples.items()}
    for client, runs in samples.items():
        m = mean[client]
        each = " / ".join(f"{s.rate:,.0f}" for s in runs)
        broker = f"; broker {m.broker_us:5.1f} us/msg" if m.broker_us else ""
        print(f"  {test:7s} {client:6s}: {m.rate:8,.0f} msg/s ({each}); client CPU {m.cpu_us:5.1f} us/msg{broker}")
    ours = mean["ours"]
    print(
        f"  {test:7s} ours/aiormq {ours.rate / mean['aiormq'].rate:.2f}x msg/s, {ours.cpu_us / mean['aiormq'].cpu_us:.2f}x CPU/msg; "
        f"ours/pika {ours.rate / mean['pika'].rate:.2f}x msg/s, {ours.cpu_us / mean['pika'].cpu_us:.2f}x CPU/msg"
    )


def profile(url: str, count: int, top: int) -> None:
    """Each client's consume and publish once more under cProfile: the functions with the most time of their own."""
    for test, run in (("consume", consume), ("publish", publish)):
        for client in CLIENTS:
            if test == "consume":
                preload(url, QUEUE, count)
            else:
                declare(url, QUEUE)
            profiler = cProfile.Profile()
            profiler.runcall(run, client, url, QUEUE, count)
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(top)
            calls = stats.total_calls  # type: ignore[attr-defined]
            print(f"\n--- {test}, {client}: {calls / count:.1f} Python function calls per message")
            print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


async def server_version(url: str) -> str:
    client = await AmqpClient.connect(sink_options(url, QUEUE).connection, "benchmark probe")
    await client.close()
    return ".".join(map(str, client.server_version or ("?",)))


def measure(url: str, label: str, broker: int | None, args: argparse.Namespace) -> None:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    version = asyncio.run(server_version(url))
    print(
        f"{args.messages:,} x {len(BODY)} B on {label} (version {version}), durable classic queue '{QUEUE}'; {args.rounds} rounds; "
        f"aiormq {version_of('aiormq')}, pika {version_of('pika')}, pamqp {version_of('pamqp')}; "
        f"{os.cpu_count()} CPUs, load average {load}",
        flush=True,
    )
    for client in CLIENTS:  # warm-up: first connections, the queue's first messages; not counted
        consume_run(client, url, 10_000, broker)
        publish_run(client, url, 10_000, broker)
    results: dict[str, dict[str, list[Sample]]] = {"consume": {c: [] for c in CLIENTS}, "publish": {c: [] for c in CLIENTS}}
    for r in range(args.rounds):
        order = CLIENTS[r % len(CLIENTS) :] + CLIENTS[: r % len(CLIENTS)]
        for test, run in (("consume", consume_run), ("publish", publish_run)):
            line = []
            for client in order:
                sample = run(client, url, args.messages, broker)
                results[test][client].append(sample)
                line.append(f"{client} {sample.rate:,.0f} msg/s {sample.cpu_us:.1f} us/msg")
            print(f"  round {r + 1} {test}: " + ", ".join(line), flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"means of {args.rounds} rounds (each round's rate in brackets); load average now {load}:")
    for test, samples in results.items():
        report(test, samples)
    declare(url, QUEUE)
    if args.profile:
        profile(url, args.profile_messages, args.profile_top)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="the broker (default: the embedded broker, in a process of its own)")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="then each client once more under cProfile")
    parser.add_argument("--profile-messages", type=int, default=50_000)
    parser.add_argument("--profile-top", type=int, default=15, help="functions shown per profile")
    args = parser.parse_args()
    if args.url:
        port = urllib.parse.urlsplit(args.url).port or 5672
        measure(args.url, f"the broker at {args.url}", listening_pid(port), args)
    else:
        with pb.embedded_broker_process() as (url, pid):
            measure(url, "the embedded broker", pid, args)


if __name__ == "__main__":
    main()
