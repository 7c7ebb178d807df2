"""The queue source over AMQP 1.0 on ActiveMQ Artemis, against python-qpid-proton reading raw and Artemis's own load tool
(``artemis perf consumer``), side by side on the same queue contents in one run.

    tools/artemis start
    .venv/bin/python benchmarks/artemis_source.py [--url amqp://guest:guest@127.0.0.1:5682] [--messages 200000] [--rounds 2]

Each round fills the queue for each reader in turn with ``artemis perf producer`` over AMQP (``--messages`` bytes
messages of 200 B, persistent, 1000 unsettled), then drains it with the reader: the source into Spark's noop sink (a
processing-time trigger: Artemis's flow frames carry no ``available``, so no AvailableNow; the rate counts the
batches' processing time, leaving out the first, as source_throughput.py does), proton (credit 1000, every delivery
accepted as it comes) and ``artemis perf consumer`` over AMQP (the broker's limit here: the median of the rates it
prints each second). The perf tool's listener reads a property only its own producer sets, so the queue is filled by
that producer for every reader. What limits the figures: broker, clients and Spark share the machine's 2 cores, and
Artemis writes every durable message to its journal.

With ``--shape both`` (issue 46) each round fills the queue with python-qpid-proton instead, once for each reader and
shape of benchmarks/shapes.py (body-only, and producer-like: each message its own message-id, correlation-id and
creation-time, a subject, a content type, three application properties and a ~207-byte JSON body), and reads it with
the source and with proton (the perf consumer cannot read messages its own producer did not send); it prints
producer-like / body-only and the CPU µs a message of Artemis's JVM, the source runner, the Python workers and Spark's
JVM.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import shapes
from machine import BROKER_PIDS, NAMED_PIDS, CpuMeter, listening_pid
from spark_runs import BatchLog, spark_session

PERF_SECONDS = 120
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "artemis")
BODY = b"x" * 200


def preload(url: str, queue: str, count: int) -> None:
    """``count`` messages of ``artemis perf producer`` (over AMQP) in ``queue``."""
    command = _cli(url, "perf", "producer", "--protocol", "AMQP", "--message-count", str(count), "--max-pending", "1000")
    out = subprocess.run(
        [*command, "--persistent", "--message-size", str(len(BODY)), f"queue://{queue}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    ).stdout
    if not re.search(rf"total sent:\s+{count}\b", out):
        raise RuntimeError(f"artemis perf producer did not send {count}:\n{out[-2000:]}")


def proton_publish(url: str, queue: str, shape: str, count: int) -> None:
    """``count`` persistent messages of ``shape`` in ``queue``, sent by python-qpid-proton (1000 unsettled at most)."""
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    parts = urllib.parse.urlsplit(url)

    class Send(MessagingHandler):
        def __init__(self) -> None:
            super().__init__()
            self.sent = self.confirmed = 0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(
                f"{parts.hostname}:{parts.port}", user=parts.username, password=parts.password, allowed_mechs="PLAIN"
            )
            event.container.create_sender(conn, queue)

        def on_sendable(self, event: Any) -> None:
            while event.sender.credit and self.sent < count and self.sent - self.confirmed < 1000:
                i = self.sent
                if shape == "body-only":
                    message = Message(body=shapes.BODY, durable=True)
                else:
                    message = Message(
                        body=shapes.producer_body(i),
                        durable=True,
                        id=shapes.message_id(i),
                        correlation_id=shapes.correlation_id(i),
                        creation_time=shapes.EPOCH + i,
                        subject=shapes.TYPE,
                        content_type=shapes.CONTENT_TYPE,
                        properties=shapes.headers(i),
                    )
                message.inferred = True  # a data section, as a producer's bytes
                event.sender.send(message)
                self.sent += 1

        def on_accepted(self, event: Any) -> None:
            self.confirmed += 1
            if self.confirmed == count:
                event.connection.close()
            else:
                self.on_sendable(event)

    Container(Send()).run()


def proton_consume(url: str, queue: str, count: int) -> float:
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    parts = urllib.parse.urlsplit(url)

    class Receive(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=1000)
            self.got = 0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(
                f"{parts.hostname}:{parts.port}", user=parts.username, password=parts.password, allowed_mechs="PLAIN"
            )
            event.container.create_receiver(conn, queue)

        def on_message(self, event: Any) -> None:
            self.got += 1
            if self.got == count:
                event.receiver.close()
                event.connection.close()

    start = time.perf_counter()
    Container(Receive()).run()
    return count / (time.perf_counter() - start)


def artemis_perf(url: str, queue: str, count: int) -> float:
    """``artemis perf consumer`` over AMQP (Qpid JMS 1.13.0 inside Artemis 2.40.0), for at most ``PERF_SECONDS``: the
    median of the rates it prints each second. Its first connection fails ("Open failed unexpectedly", a warning)
    and the ones after open."""
    command = _cli(url, "perf", "consumer", "--protocol", "AMQP")
    out = subprocess.run(
        [*command, "--message-count", str(count), "--duration", str(PERF_SECONDS), f"queue://{queue}"],
        capture_output=True,
        text=True,
        timeout=PERF_SECONDS + 300,
        check=False,
    ).stdout
    # It reports what it received each second; the median of those seconds (a last, partial second left out).
    found = [float(v) for v in re.findall(r"received:\s+(\d+) msg/sec", out)]
    steady = [v for v in found[:-1] if v > 0] or [v for v in found if v > 0]
    if not steady:
        raise RuntimeError(f"artemis perf consumer printed no rate:\n{out[-2000:]}")
    return statistics.median(steady)


def purge(url: str, queue: str) -> None:
    """What a reader left in ``queue``, removed."""
    subprocess.run(_cli(url, "queue", "purge", "--name", queue), capture_output=True, timeout=300, check=True)


def _cli(url: str, *command: str) -> list[str]:
    """An artemis CLI command, logged in as ``url``'s user: on the broker's AMQP acceptor (``url``) for a perf command over
    AMQP, else on its core acceptor."""
    parts = urllib.parse.urlsplit(url)
    if "AMQP" in command:
        target = f"amqp://{parts.hostname}:{parts.port}"
    else:
        target = subprocess.run([TOOL, "core-url"], capture_output=True, text=True, check=True).stdout.strip()
    return [TOOL, "cli", *command, "--url", target, "--user", parts.username or "guest", "--password", parts.password or "guest"]


def source_noop(spark: Any, url: str, queue: str, count: int, workdir: str) -> float:
    """The source into noop until ``count`` rows: the steady rate (rows over processing time, the first batch left out)."""
    run = uuid.uuid4().hex[:8]
    reader = spark.readStream.format("amqp").option("uri", url).option("protocol", "amqp1.0").option("queue", queue)
    writer = reader.load().writeStream.format("noop").option("checkpointLocation", os.path.join(workdir, f"ckpt-{run}"))
    query = writer.trigger(processingTime="0 seconds").start()
    log = BatchLog(query)
    deadline = time.monotonic() + 900
    while log.rows < count and query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)  # a benchmark's poll of the progress, not a test's wait
    query.stop()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    if log.rows < count:
        raise RuntimeError(f"the source read {log.rows} of {count}")
    steady = log.batches[1:] or log.batches  # (the warm-up's 20,000 may come in one batch)
    return sum(b[0] for b in steady) / sum(b[1] for b in steady)


def shapes_run(spark: Any, args: argparse.Namespace, queue: str, workdir: str) -> None:
    """Both shapes, read by the source and by proton, in alternating order each round; CPU per message per process."""
    from source_throughput import cpu_text, median_cpu

    n = args.messages
    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for shape in shapes.SHAPES if round_ % 2 == 0 else shapes.SHAPES[::-1]:
            for name in ("source -> noop", "proton"):
                proton_publish(args.url, queue, shape, n)
                with CpuMeter() as cpu:
                    rate = (
                        source_noop(spark, args.url, queue, n, workdir) if name == "source -> noop" else proton_consume(args.url, queue, n)
                    )
                rates.setdefault((name, shape), []).append(rate)
                cpus.setdefault((name, shape), []).append(cpu.per_message(n))
                print(f"round {round_ + 1}: {name:15s} {shape:9s} {rate:9,.0f} msg/s\n    {cpu.summary(n)}", flush=True)
    for shape in shapes.SHAPES:
        source, proton = (statistics.median(rates[(name, shape)]) for name in ("source -> noop", "proton"))
        print(f"{shape:9s}: source {source:9,.0f} msg/s = {source / proton:.2f}x proton ({proton:,.0f}); medians of {args.rounds}")
        for name in ("source -> noop", "proton"):
            print(f"    {name}: CPU us/msg (medians): {cpu_text(median_cpu(cpus[(name, shape)]))}")
    ratio = statistics.median(rates[("source -> noop", "producer")]) / statistics.median(rates[("source -> noop", "body-only")])
    proton_ratio = statistics.median(rates[("proton", "producer")]) / statistics.median(rates[("proton", "body-only")])
    print(f"producer-like / body-only: the source {ratio:.2f}x, proton {proton_ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=os.environ.get("AMQP_TEST_ARTEMIS_URL", "amqp://guest:guest@127.0.0.1:5682"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shape", choices=("both",), default=None, help="both shapes (shapes.py), filled by proton (see above)")
    args = parser.parse_args()
    broker = listening_pid(urllib.parse.urlsplit(args.url).port or 5682)
    if broker is not None:
        NAMED_PIDS[broker] = "artemis"
        BROKER_PIDS.add(broker)  # so that the RabbitMQ nodes on the machine count as other brokers
    spark = spark_session("spark-amqp Artemis benchmark")
    workdir = tempfile.mkdtemp(prefix="amqp-artemis-bench-")
    queue = f"bench-artemis-{uuid.uuid4().hex[:6]}"
    rates: dict[str, list[float]] = {"source -> noop": [], "proton": [], "artemis perf consumer": []}
    try:
        print(
            f"{args.messages} x {len(BODY)} B on ActiveMQ Artemis at {urllib.parse.urlsplit(args.url).netloc.split('@')[-1]}; load average {os.getloadavg()[0]:.2f}"
        )
        preload(args.url, queue, 20_000)  # warm up the JVM and the Python workers; not measured
        source_noop(spark, args.url, queue, 20_000, workdir)
        if args.shape:
            shapes_run(spark, args, queue, workdir)
            return
        for round_ in range(args.rounds):
            for name in rates:
                preload(args.url, queue, args.messages)
                if name == "source -> noop":
                    rate = source_noop(spark, args.url, queue, args.messages, workdir)
                elif name == "proton":
                    rate = proton_consume(args.url, queue, args.messages)
                else:
                    try:
                        rate = artemis_perf(args.url, queue, args.messages)
                    except RuntimeError as err:  # printed, not hidden: the other readers' figures still stand
                        print(f"round {round_ + 1}: artemis perf consumer gave no rate: {err}", flush=True)
                        purge(args.url, queue)
                        continue
                rates[name].append(rate)
                print(f"round {round_ + 1}: {name:22s} {rate:9,.0f} msg/s", flush=True)
        medians = {k: statistics.median(v) for k, v in rates.items() if v}
        perf = medians.get("artemis perf consumer")
        beside = f"{medians['source -> noop'] / perf:.2f}x artemis perf consumer ({perf:,.0f})" if perf else "artemis perf: no rate"
        print(
            f"source over AMQP 1.0 -> noop: {medians['source -> noop']:,.0f} msg/s = "
            f"{medians['source -> noop'] / medians['proton']:.2f}x proton ({medians['proton']:,.0f}), {beside}; medians of {args.rounds}"
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
