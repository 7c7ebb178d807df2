"""Which batches' property columns the compiled core made over AMQP 1.0 (``reading.core_properties``): one entry per
batch of AMQP 1.0 deliveries offered to it, whether it made them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from spark_amqp.reading import core_properties


def _spy(made: list[bool]) -> Callable[[Any, Any], Any]:
    real = core_properties._from_sections

    def spy(props: Any, wanted: Any) -> Any:
        arrays = real(props, wanted)
        made.append(arrays is not None)
        return arrays

    return spy


def watch(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For the rest of a test."""
    made: list[bool] = []
    monkeypatch.setattr(core_properties, "_from_sections", _spy(made))
    return made


@contextlib.contextmanager
def core_batches() -> Iterator[list[bool]]:
    """While in the block (a hypothesis test has no monkeypatch of its own for each example)."""
    made: list[bool] = []
    real = core_properties._from_sections
    core_properties._from_sections = _spy(made)
    try:
        yield made
    finally:
        core_properties._from_sections = real
