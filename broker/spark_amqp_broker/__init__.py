"""An in-memory AMQP 0-9-1 broker for tests and demos (see ``EmbeddedBroker``)."""

from .server import BrokerServer, EmbeddedBroker

__all__ = ["BrokerServer", "EmbeddedBroker"]
