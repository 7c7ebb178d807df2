"""A small asyncio AMQP 0-9-1 client on pamqp: what the source and the sink need and nothing more.

It stands on ``spark_amqp.transport`` (the walk over the uri's endpoints, TLS, the
login, heartbeats, token renewal): ``connection`` (frames, the AMQP handshake),
``channel`` (calls with timeouts, closes, content assembly), ``consumer``
(deliveries, queue depths), ``publisher`` (publish frames, confirms, returns),
``properties`` (lenient, lazy property decoding), ``super_streams`` (a super
stream's partitions by name), ``blocking`` (one client on a loop thread).
"""

from .channel import ClientChannel
from .connection import AmqpClient
from .consumer import QueueStats, queue_depths, queue_stats, stats_of
from .properties import LazyProperties

__all__ = ["AmqpClient", "ClientChannel", "LazyProperties", "QueueStats", "queue_depths", "queue_stats", "stats_of"]
