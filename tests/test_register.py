"""``spark_amqp.register``'s decision, on stand-ins for sessions: on Spark Connect it leaves a session whose lookup
already finds the connector as it is (registering there fails PySpark 4.3.0's pipeline runs: docs/pipelines.md).
The real sessions: tests/spark/test_pipelines.py (a pipeline), test_deployments.py and test_threads.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import spark_amqp
from spark_amqp.datasource import AmqpDataSource


class ConnectSession:
    """What register touches of a Spark Connect session: no ``_jsparkSession``; a read's schema, which analyses
    the plan on the server and raises what the lookup raised."""

    def __init__(self, lookup_error: str | None) -> None:
        self.registered: list[Any] = []
        self.lookups = 0
        self.dataSource = SimpleNamespace(register=self.registered.append)
        self.read = SimpleNamespace(format=self._format)
        self._error = lookup_error

    def _format(self, name: str) -> Any:
        assert name == "amqp"
        return SimpleNamespace(load=lambda: SimpleNamespace(schema=self._schema()))

    def _schema(self) -> Any:
        self.lookups += 1
        if self._error is not None:
            raise RuntimeError(self._error)
        return "some other source's schema"


FOUND = "[PYTHON_DATA_SOURCE_ERROR] … AmqpOptionError: option 'uri' is required: the broker's AMQP URI …"


def test_a_connect_session_that_finds_the_connector_is_left_alone() -> None:
    session = ConnectSession(FOUND)
    spark_amqp.register(session)
    assert (session.lookups, session.registered) == (1, [])


@pytest.mark.parametrize(
    "lookup_error",
    ["[DATA_SOURCE_NOT_FOUND] Failed to find the data source: amqp.", None],
    ids=["not-found", "another-source-named-amqp"],
)
def test_a_connect_session_that_does_not_find_it_gets_it_registered(lookup_error: str | None) -> None:
    session = ConnectSession(lookup_error)
    spark_amqp.register(session)
    assert (session.lookups, session.registered) == (1, [AmqpDataSource])


def test_a_classic_session_is_always_registered_without_a_lookup() -> None:
    # Classic sessions also need register() to set the thread's active session, and have no pipeline bug to avoid.
    session = ConnectSession(FOUND)
    session._jsparkSession = object()  # type: ignore[attr-defined]  # a classic session's; no JVM behind it here
    spark_amqp.register(session)
    assert (session.lookups, session.registered) == (0, [AmqpDataSource])
