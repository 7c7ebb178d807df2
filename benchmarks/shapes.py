"""The two message shapes the benchmarks read and write (issue 46).

- ``body-only``: what PerfTest sends, and what every benchmark used before: a 200-byte body, no
  properties. Every message's header is the same, which a reader can decode once and reuse.
- ``producer``: what an application's producer sends: each message with its own message id,
  correlation id and timestamp, a type, an app id, a content type, three headers (AMQP 0-9-1) or
  application properties (AMQP 1.0, the stream protocol), and a JSON body of about 200 bytes.

``pika_properties`` gives the AMQP 0-9-1 properties of the i-th message (for
``pika_baseline.publish_async``), ``bodies`` the bodies, and ``arrow_batches`` the same messages as
the connector's sink takes them (``body`` and the property columns), for its publishers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pika
import pyarrow as pa

SHAPES = ("body-only", "producer")
BODY = b"x" * 200
EPOCH = 1_764_650_000  # the first message's timestamp (epoch seconds); message i's is EPOCH + i
TYPE = "order.created"
APP_ID = "checkout-service"
CONTENT_TYPE = "application/json"
REGIONS = ("eu-west-1", "us-east-1", "ap-south-1")
_NAMESPACE = uuid.UUID("6f1c2b1e-0c1d-4f55-9a51-3d2f5e8b4a10")


def message_id(i: int) -> str:
    return str(uuid.UUID(int=_NAMESPACE.int ^ (i * 0x9E3779B97F4A7C15 % (1 << 122))))


def correlation_id(i: int) -> str:
    return f"corr-{i // 4:010d}"  # a request answered by four messages: shared by neighbours, never by all


def headers(i: int) -> dict[str, str]:
    return {"tenant": f"tenant-{i % 97:03d}", "region": REGIONS[i % len(REGIONS)], "trace_id": f"{(i * 2654435761) % (1 << 64):016x}"}


def producer_body(i: int) -> bytes:
    """An order as JSON, about 205 bytes."""
    order = {
        "order_id": f"ord-{i:010d}",
        "customer": f"cust-{i % 10007:06d}",
        "amount": round(10 + (i % 9973) * 0.37, 2),
        "currency": "EUR",
        "items": [{"sku": f"sku-{i % 503:04d}", "qty": 1 + i % 3}, {"sku": f"sku-{(i * 7) % 503:04d}", "qty": 1}],
        "created_at": f"2026-12-02T05:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        "channel": "web",
    }
    return json.dumps(order, separators=(",", ":")).encode()


def body(shape: str, i: int) -> bytes:
    return BODY if shape == "body-only" else producer_body(i)


def pika_properties(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        message_id=message_id(i),
        correlation_id=correlation_id(i),
        timestamp=EPOCH + i,
        type=TYPE,
        app_id=APP_ID,
        content_type=CONTENT_TYPE,
        headers=headers(i),
    )


def arrow_batches(shape: str, count: int, size: int = 10_000) -> Iterator[pa.RecordBatch]:
    """``count`` messages of ``shape`` as the sink's input columns, ``size`` rows a batch."""
    header_type = pa.map_(pa.string(), pa.string())
    for start in range(0, count, size):
        ids = range(start, min(count, start + size))
        if shape == "body-only":
            yield pa.RecordBatch.from_pydict({"body": [BODY] * len(ids)})
            continue
        yield pa.RecordBatch.from_pydict(
            {
                "body": [producer_body(i) for i in ids],
                "message_id": [message_id(i) for i in ids],
                "correlation_id": [correlation_id(i) for i in ids],
                "timestamp": pa.array([EPOCH + i for i in ids], pa.int64()),
                "type": [TYPE] * len(ids),
                "app_id": [APP_ID] * len(ids),
                "content_type": [CONTENT_TYPE] * len(ids),
                "headers": pa.array([list(headers(i).items()) for i in ids], header_type),
            }
        )


def mean_body_size(shape: str, sample: int = 1000) -> float:
    return sum(len(body(shape, i)) for i in range(sample)) / sample
