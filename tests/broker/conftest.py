from __future__ import annotations

import pytest

from .helpers import connect


@pytest.fixture
def conn(amqp_url: str):  # type: ignore[no-untyped-def]
    c = connect(amqp_url)
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn):  # type: ignore[no-untyped-def]
    return conn.channel()
