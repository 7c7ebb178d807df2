"""What the broker says and reads during the connection handshake."""

from __future__ import annotations

from typing import Any

from pamqp import commands


def server_properties() -> dict[str, Any]:
    return {
        "product": "spark-amqp embedded broker",
        "version": "1.0",
        "platform": "Python asyncio",
        "capabilities": {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "exchange_exchange_bindings": True,
            "per_consumer_qos": True,
            "authentication_failure_close": True,
            "connection.blocked": False,
        },
    }


def credentials(method: commands.Connection.StartOk) -> tuple[str, str]:
    """User and password from a start-ok (PLAIN or AMQPLAIN); empty strings when unreadable."""
    response = method.response
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
    if method.mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    elif method.mechanism == "AMQPLAIN":
        from pamqp import decode

        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
            return str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
        except ValueError:
            pass
    return "", ""
