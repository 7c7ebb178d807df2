"""The fixtures of the stream-mode tests: the planners a test made, closed after it, and ``read_over``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_amqp.stream_protocol import core
from spark_amqp.streams.planner import StreamPlanner

from . import helpers


@pytest.fixture(params=["amqp", "stream-protocol", "stream-protocol-python", "amqp1.0", "amqp1.0-python"])
def read_over(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The protocol ``helpers.options`` reads over: the test's AMQP 0-9-1 url, the same broker's stream-protocol
    url (with the compiled core where it is installed, and again on the pure-Python path: ``stream-protocol-python``),
    or its AMQP 0-9-1 url with protocol=amqp1.0 (RabbitMQ 4.x; again on the pure-Python path: ``amqp1.0-python``). A module that must behave the same over all asks for
    it for every test (``usefixtures``); tests of what only the AMQP 0-9-1 reader does are marked ``amqp_only``."""
    if request.param != "amqp" and request.node.get_closest_marker("amqp_only"):
        pytest.skip("what only the AMQP 0-9-1 reader does")
    over = request.param
    if over.endswith("-python"):
        over = over.removesuffix("-python")
        if core.CORE is None:
            pytest.skip(f"no compiled core here: {over} ran on the pure-Python path already")
        monkeypatch.setattr(core, "CORE", None)  # read_range's readers ask for it as they connect
    helpers.READ_OVER[0] = over
    yield over
    helpers.READ_OVER[0] = "amqp"


@pytest.fixture
def planners() -> Iterator[list[StreamPlanner]]:
    made: list[StreamPlanner] = []
    yield made
    for p in made:
        p.close()
