"""The Artemis tests run one at a time, whichever worker runs them: two of them restart the broker the others use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..locks import exclusive


@pytest.fixture(autouse=True)
def one_at_a_time() -> Iterator[None]:
    with exclusive("artemis"):
        yield
