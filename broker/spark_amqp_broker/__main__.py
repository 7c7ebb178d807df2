"""``python -m spark_amqp_broker``: run the embedded broker until interrupted."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from .server import DEFAULT_CONSUMER_TIMEOUT_MS, EmbeddedBroker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_amqp_broker",
        description="In-memory AMQP 0-9-1 and AMQP 1.0 broker with RabbitMQ's stream protocol (nothing is persisted).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--stream-port", type=int, default=0, help="port of RabbitMQ's stream protocol (default: any free one, logged)")
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--heartbeat", type=int, default=60, help="heartbeat interval offered to clients, seconds")
    parser.add_argument("--consumer-timeout-ms", type=int, default=DEFAULT_CONSUMER_TIMEOUT_MS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    broker = EmbeddedBroker(
        args.host, args.port, args.user, args.password, args.heartbeat, args.consumer_timeout_ms, stream_port=args.stream_port
    )
    # Handlers first: a SIGTERM that comes once clients can connect must stop the broker cleanly.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    broker.start()
    logging.info(
        "embedded AMQP broker listening on %s:%s (AMQP 0-9-1 and 1.0), stream protocol on %s (in memory only)",
        args.host,
        broker.port,
        broker.stream_port,
    )
    stop.wait()
    broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
