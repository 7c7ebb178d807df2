"""RabbitMQ's stream protocol (port 5552): framing (``wire``), osiris chunks (``chunks``), AMQP 1.0
messages as streams store them (``amqp10``), and an asyncio client (``client``)."""
