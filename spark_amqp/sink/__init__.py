"""The sink: ``df.write.format("amqp")`` and ``df.writeStream.format("amqp")``."""
