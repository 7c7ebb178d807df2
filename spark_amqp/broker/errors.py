"""AMQP exceptions raised inside the embedded broker.

Each carries the reply code and the text RabbitMQ would send; whether it closes
the channel or the whole connection follows from the code, as in the spec.
"""

from __future__ import annotations

from ..errors import REPLY_CODES

REPLY_NAMES = REPLY_CODES

# Soft errors close only the channel; the rest close the connection.
CHANNEL_CODES = frozenset({311, 312, 313, 403, 404, 405, 406})


class AmqpError(Exception):
    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = code
        name = REPLY_NAMES.get(code, "ERROR")
        self.text = text if text.startswith(f"{name} - ") else f"{name} - {text}"
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)

    @property
    def closes_connection(self) -> bool:
        return self.code not in CHANNEL_CODES


def access_refused(text: str) -> AmqpError:
    return AmqpError(403, text)


def not_found(text: str) -> AmqpError:
    return AmqpError(404, text)


def resource_locked(text: str) -> AmqpError:
    return AmqpError(405, text)


def precondition_failed(text: str) -> AmqpError:
    return AmqpError(406, text)


def frame_error(text: str) -> AmqpError:
    return AmqpError(501, text)


def command_invalid(text: str) -> AmqpError:
    return AmqpError(503, text)


def channel_error(text: str) -> AmqpError:
    return AmqpError(504, text)


def unexpected_frame(text: str) -> AmqpError:
    return AmqpError(505, text)


def not_allowed(text: str) -> AmqpError:
    return AmqpError(530, text)


def not_implemented(text: str) -> AmqpError:
    return AmqpError(540, text)
