"""Stream mode: RabbitMQ stream queues read by offset ranges, in parallel, on executors (``option("stream")``).

``offset`` (the checkpointed position), ``ranges`` (pure planning), ``probe``
(a stream's ends, asked of the broker), ``planner`` (the driver side),
``range_reader`` (the executor side), ``reader`` (Spark's reader class).
"""
