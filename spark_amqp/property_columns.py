"""The AMQP message properties as columns: one list shared by the source's schema and the sink's input."""

from __future__ import annotations

# Under pika's attribute names, in the source schema's column order.
STRING_PROPERTIES = (
    "message_id",
    "correlation_id",
    "content_type",
    "content_encoding",
    "type",
    "app_id",
    "user_id",
    "reply_to",
    "expiration",
)
INT_PROPERTIES = ("priority", "delivery_mode")
