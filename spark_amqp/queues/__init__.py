"""Queue mode: classic and quorum queues, consumed with acks held until Spark commits (``option("queue")``).

``reader`` (Spark's reader class), ``options``, ``offset`` (the checkpointed position), ``runtime``
(batches, acks), ``session`` (the I/O thread), ``journal``/``journalled`` (exactly-once), and the small
pure parts. Nothing is imported here, so that parsing options does not load the reader.
"""
