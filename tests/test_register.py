"""``spark_amqp.register``'s decision, on stand-ins for sessions: on Spark Connect it leaves a session whose lookup
already finds the connector as it is (registering there fails PySpark 4.3.0's pipeline runs: docs/pipelines.md).
The real sessions: tests/spark/test_pipelines.py (a pipeline), test_deployments.py and test_threads.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest

import spark_amqp
from spark_amqp.datasource import AmqpDataSource


class ConnectSession:
    """What register touches of a Spark Connect session: no ``_jsparkSession``; a read's schema, which the server
    answers by analysing the plan: the source's schema for the options, or the lookup's error."""

    def __init__(self, found: str) -> None:
        self.registered: list[Any] = []
        self.options: list[dict[str, str]] = []
        self.dataSource = SimpleNamespace(register=self.registered.append)
        self.read = SimpleNamespace(format=self._format)
        self._found = found

    def _format(self, name: str) -> Any:
        assert name == "amqp"
        options: dict[str, str] = {}
        self.options.append(options)

        def option(key: str, value: str) -> Any:
            options[key] = value
            return reader

        reader = SimpleNamespace(option=option, load=lambda: SimpleNamespace(schema=self._schema(options)))
        return reader

    def _schema(self, options: dict[str, str]) -> Any:
        if self._found == "this":
            # What the connector's own source answers, without connecting.
            ddl = AmqpDataSource(options).schema()
            return SimpleNamespace(fieldNames=lambda: [column.split()[0] for column in ddl.split(", ")])
        if self._found == "another":
            return SimpleNamespace(fieldNames=lambda: ["value"])
        raise RuntimeError("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: amqp.")


def test_a_connect_session_that_finds_the_connector_is_left_alone() -> None:
    session = ConnectSession("this")
    spark_amqp.register(session)
    assert session.registered == []
    # The lookup's options make the source answer without connecting: a host that resolves nowhere.
    assert [urlsplit(o["uri"]).hostname.endswith(".invalid") for o in session.options] == [True]  # type: ignore[union-attr]


@pytest.mark.parametrize("found", ["nothing", "another"], ids=["not-found", "another-source-named-amqp"])
def test_a_connect_session_that_does_not_find_it_gets_it_registered(found: str) -> None:
    session = ConnectSession(found)
    spark_amqp.register(session)
    assert (len(session.options), session.registered) == (1, [AmqpDataSource])


def test_a_classic_session_is_always_registered_without_a_lookup() -> None:
    # Classic sessions also need register() to set the thread's active session, and have no pipeline bug to avoid.
    session = ConnectSession("this")
    session._jsparkSession = object()  # type: ignore[attr-defined]  # a classic session's; no JVM behind it here
    spark_amqp.register(session)
    assert (session.options, session.registered) == ([], [AmqpDataSource])
