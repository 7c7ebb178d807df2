from __future__ import annotations

import json

import pytest

from spark_amqp.errors import AmqpSourceError
from spark_amqp.queues.offset import AmqpSourceOffset, QueuePosition


def test_json_round_trip_is_canonical() -> None:
    o = AmqpSourceOffset.initial(["b", "a"]).advanced({"b": QueuePosition("run.2", 17)})
    assert o.to_json() == {"v": 1, "queues": {"a": {"session": "", "tag": 0}, "b": {"session": "run.2", "tag": 17}}}
    assert AmqpSourceOffset.from_json(json.dumps(o.to_json())) == o
    assert o.key == AmqpSourceOffset.from_json(o.to_json()).key
    assert o.position("b").tag == 17 and o.position("missing") == QueuePosition("", 0)


@pytest.mark.parametrize(
    "bad",
    [
        {"queues": {}},
        {"v": 2, "queues": {}},
        {"v": 1, "queues": []},
        {"v": 1, "queues": {"q": {"session": "s"}}},
        {"v": 1, "queues": {"q": {"session": "s", "tag": -1}}},
        {"v": 1, "queues": {"q": {"session": 3, "tag": 1}}},
        {"v": 1, "queues": {"q": {"session": "s", "tag": True}}},
    ],
)
def test_strict_parsing(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(AmqpSourceError, match="not an AMQP source offset"):
        AmqpSourceOffset.from_json(bad)
