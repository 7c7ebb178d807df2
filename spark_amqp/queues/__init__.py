"""Queue mode: classic and quorum queues, consumed with acks held until Spark commits (``option("queue")``).

``reader`` (Spark's reader class), ``runtime`` (batches, acks), ``session`` (the I/O thread), ``offset``
(the checkpointed position), ``journal``/``journalled`` (exactly-once), and the small pure parts.
"""

from .reader import QueueBatchPartition, QueueReader

__all__ = ["QueueBatchPartition", "QueueReader"]
