"""An asyncio AMQP 1.0 client on the package's own AMQP 1.0 encoding (``spark_amqp.amqp10``), standing on the
transport: ``connection`` (the handshake, one session, frames to links), ``links`` (receivers and senders)."""

from .connection import Amqp10Client
from .links import Receiver, Sender

__all__ = ["Amqp10Client", "Receiver", "Sender"]
