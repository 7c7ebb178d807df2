"""The stream sink's tests reach the brokers as the stream-protocol client's do: each real node, and the embedded broker."""

from tests.stream_protocol.conftest import stream_name, stream_node

__all__ = ["stream_name", "stream_node"]
