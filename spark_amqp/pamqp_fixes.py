"""pamqp 3.x (the newest pamqp for Python 3.10; pamqp 4 needs 3.11) cannot put an integer from -128
to -1 in a field table: it picks the signed octet type ``b`` but packs the value unsigned, and
raises ``struct.error``. A header of -1 from the sink, or ``x-priority: -1`` in consumer arguments,
would fail. pamqp 4 packs it signed, as AMQP and RabbitMQ read ``b``; with pamqp 3 the same encoding
is put in place here, once, when the package is imported. Decoding ``b`` is signed in both."""

from __future__ import annotations

import struct

from pamqp import encode

__all__ = ["FIXED"]

_SIGNED_OCTET = struct.Struct(">b")


def _needs_fix() -> bool:
    try:
        encode.table_integer(-1)
    except struct.error:
        return True
    return False


FIXED = _needs_fix()

if FIXED:
    _table_integer = encode.table_integer

    def _signed_table_integer(value: int) -> bytes:
        if -128 <= value < 0 and not encode.DEPRECATED_RABBITMQ_SUPPORT:
            return b"b" + _SIGNED_OCTET.pack(value)
        return _table_integer(value)

    # encode_table_value looks table_integer up in its module at each call.
    encode.table_integer = _signed_table_integer
