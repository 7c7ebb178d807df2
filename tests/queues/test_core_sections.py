"""Queue mode over AMQP 1.0: a batch's property columns made by the compiled core from each delivery's sections before
the body (``queues.amqp10_rows``, ``reading.core_properties``) against the pure-Python path (``RowMaker.properties``),
on random and damaged messages (hypothesis), every column or some of them, RabbitMQ's conversions and another
broker's. Equal tables, or the same error on both paths; the core must take the batches of well-formed messages it
renders (so a core that took nothing would fail here). ``CORE_EXAMPLES`` raises the example count."""

from __future__ import annotations

import logging
import os
import uuid

import pyarrow as pa
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (the test extra and the Makefile's venvs have it)")
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_amqp.amqp10 import message as amqp10_message
from spark_amqp.queues.amqp10_rows import LazySections, QueueRows
from spark_amqp.queues.inbox import Delivery
from spark_amqp.queues.options import parse_source_options
from spark_amqp.queues.runtime import SourceRuntime
from spark_amqp.reading import arrow, core_properties
from spark_amqp.reading.projection import Projection
from spark_amqp.stream_protocol import core
from spark_amqp.stream_protocol.rows import STANDARD, Conversion, RowMaker

from ..stream_protocol.test_core_differential import records, section, tame_annotations, tame_apps, tame_header, tame_properties
from .core_spy import core_batches

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

EXAMPLES = int(os.environ.get("CORE_EXAMPLES", "600"))
SCHEMA = arrow.ARROW_SCHEMA
CONVERSIONS = {"3.13": Conversion.of((3, 13)), "4.0": Conversion.of((4, 0)), "4.3": Conversion.of((4, 3)), "other": STANDARD}


@st.composite
def tame_records(draw: st.DrawFn) -> bytes:
    """A message such as a broker delivers: the sections in order, values the core renders, one data section."""
    parts = [
        section(code, v)
        for code, v in zip(
            (0x70, 0x72, 0x73, 0x74), draw(st.tuples(tame_header, tame_annotations, tame_properties, tame_apps)), strict=True
        )
        if v is not None
    ]
    return b"".join(parts) + section(0x75, draw(st.binary(max_size=50)))


projections = st.one_of(
    st.none(),
    st.just(("body", "delivery_tag")),
    st.lists(st.sampled_from(SCHEMA.names), min_size=1, max_size=6, unique=True).map(tuple),
).map(lambda names: None if names is None else Projection("queue", names, names, (False,) * len(names)))


def _batch(messages: list[bytes], conv: Conversion, columns: Projection | None, use_core: bool) -> tuple[pa.Table | None, str]:
    """What the queue source makes of ``messages`` delivered in this order on one path: (table, "") or (None, error)."""
    rows = QueueRows("q", conv)
    saved = core.CORE
    try:
        deliveries = []
        for tag, m in enumerate(messages):
            body, exchange, key, props = rows.row(m)
            deliveries.append(Delivery("s", "q", tag, props.redelivered, exchange, key, props, body))
        core.CORE = saved if use_core else None
        batch = arrow.to_record_batch(deliveries, columns)
    except Exception as err:  # the same refusal on both paths is what the test asks
        return None, f"{type(err).__name__}: {err}"
    finally:
        core.CORE = saved
    batch.validate(full=True)
    return pa.Table.from_batches([batch]), ""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    st.one_of(st.lists(records(), min_size=1, max_size=4), st.lists(tame_records(), min_size=2, max_size=5)),
    st.sampled_from(sorted(CONVERSIONS)),
    projections,
)
def test_the_core_makes_the_property_columns_python_makes(messages: list[bytes], version: str, columns: Projection | None) -> None:
    conv = CONVERSIONS[version]
    with core_batches() as taken:
        got, got_error = _batch(messages, conv, columns, use_core=True)
    want, want_error = _batch(messages, conv, columns, use_core=False)
    event(
        "taken by the core"
        if any(taken)
        else "left to Python"
        if taken
        else "not the core's to take (no property column, one shared header, 3.x)"
    )
    assert got_error == want_error
    if want is not None:
        assert got is not None and got.schema.equals(want.schema) and got.equals(want), (got, want)


def test_the_core_takes_producer_like_messages_and_rabbitmq_3_is_pythons() -> None:
    """Messages such as RabbitMQ 4.3 delivers a producer's (tests/queues/test_amqp10_source.py reads real ones)."""
    messages = [
        amqp10_message.encode(
            b'{"order": %d}' % i,
            header=[False, None, None, True, 0],
            annotations={"x-routing-key": "q", "x-exchange": "", "x-basic-type": "order.created"},
            properties=[str(uuid.uuid4()), None, None, None, None, f"corr-{i // 4}", "application/json"],
            application_properties={"tenant": f"t-{i % 7}", "region": "eu", "n": i},
        )
        for i in range(50)
    ]
    rows = QueueRows("q", Conversion.of((4, 3)))
    props = [rows.row(m)[3] for m in messages]
    assert all(isinstance(p, LazySections) and p.columns is None for p in props), "decoded on arrival"
    made = core_properties.property_arrays(props, arrow.PROPERTY_COLUMNS)
    assert made is not None, "the core left a batch of plain messages to Python"
    python = [RowMaker("q", Conversion.of((4, 3))).properties(p.key) for p in props]
    assert [a.to_pylist() for a in made[:3]] == [[r[i] for r in python] for i in range(3)]
    legacy = QueueRows("q", Conversion.of((3, 13)))
    assert core_properties.property_arrays([legacy.row(m)[3] for m in messages], arrow.PROPERTY_COLUMNS) is None


def test_arrival_decodes_each_distinct_header_and_annotations_once() -> None:
    rows = QueueRows("q", Conversion.of((4, 3)))
    first = amqp10_message.encode(b"a", header=[True, None, None, True, 0], annotations={"x-exchange": "x", "x-routing-key": "k"})
    again = amqp10_message.encode(b"b", header=[True, None, None, False, 1], annotations={"x-exchange": "x", "x-routing-key": "k"})
    assert rows.row(first)[:3] == (b"a", "x", "k") and rows.row(first)[3].redelivered is False
    assert rows.row(again)[3].redelivered is True and len(rows._heads) == 2
    body_alone = amqp10_message.encode(b"c")
    body, exchange, key, props = rows.row(body_alone)  # no sections before the body: decoded whole, as a stream's
    assert (body, exchange, key) == (b"c", "", "q") and not isinstance(props, LazySections)


def test_the_queue_runner_says_which_path_makes_its_rows(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    options = parse_source_options({"uri": "amqp://127.0.0.1:1/%2F", "queue": "q", "protocol": "amqp1.0"})
    with caplog.at_level(logging.INFO, logger="spark_amqp.queues"):
        SourceRuntime(options)
        monkeypatch.setattr(core, "CORE", None)
        monkeypatch.setattr(core, "PATH", "pure Python (SPARK_AMQP_PURE_PYTHON=1)")
        SourceRuntime(options)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("AMQP source: rows")]
    assert said == [
        "AMQP source: rows: pure Python but the property columns: compiled core (spark-amqp-core 0.1.0, Rust)",
        "AMQP source: rows: pure Python (SPARK_AMQP_PURE_PYTHON=1)",
    ]
