"""The sinks' messages written by the compiled core against the pure-Python path (hypothesis): for random batches of
every property column, values Python refuses among them, each sink's builder (the stream sink's and the AMQP 1.0
sink's AMQP 1.0 messages, the AMQP 0-9-1 sink's content headers, which pamqp marshals on the Python path) gives the
same bytes for every row, or the same error. The core leaves a batch to Python whole (then the two
are the same code), so each test also counts what the core took: a core that took nothing would pass the comparison
and fail there. ``CORE_EXAMPLES`` raises the example counts for a longer run."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (the test extra and the Makefile's venvs have it)")
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_amqp.errors import AmqpOptionError
from spark_amqp.property_columns import STRING_PROPERTIES
from spark_amqp.sink import core_records
from spark_amqp.sink.amqp10_messages import Amqp10MessageBuilder
from spark_amqp.sink.columns import MessageBuilder, Outgoing
from spark_amqp.sink.options import parse_sink_options
from spark_amqp.sink.producers import producer_for
from spark_amqp.sink.stream_messages import StreamMessageBuilder
from spark_amqp.stream_protocol import core

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

EXAMPLES = int(os.environ.get("CORE_EXAMPLES", "400"))
VERSIONS = [(3, 10), (3, 13), (4, 0), (4, 3)]
SINKS = ["stream", "amqp1.0", "amqp"]  # the AMQP 1.0 messages of both, and the AMQP 0-9-1 sink's content headers

# Values Python refuses are rarer than the others, so that the core writes a good share of the batches.
_short = st.text(max_size=12)
_text = st.one_of(
    _short,
    _short,
    _short,
    st.text(alphabet="ab-é☃/ %", min_size=60, max_size=130),  # either side of a short string's 255 bytes
    st.sampled_from(["", "x-stream-filter-value", "x-basic-type", "x-basic-app-id", "text/plain", "12", "4294967296"]),
)
# The columns whose values Python holds to more than a short string: symbols (ASCII) and expiration (digits).
_ASCII = st.one_of(st.text(alphabet="abcdefghijklmnopqrstuvwxyz/+.-", max_size=20), st.text(alphabet="aé☃", max_size=300))
_OWN_TEXT = {
    "content_type": _ASCII,
    "content_encoding": _ASCII,
    "expiration": st.one_of(st.integers(0, 2**32 + 5).map(str), st.sampled_from(["", "1a", "-1", "00012", "99999999999999999999"]), _text),
}
_OCTETS = {"priority": st.one_of(st.integers(0, 255), st.sampled_from([-1, 256])), "delivery_mode": st.sampled_from([1, 2, 1, 2, 0, 3])}
_seconds = st.one_of(st.integers(-2, 2**31), st.sampled_from([253402300799, 253402300800, 0]))
_micros = st.one_of(
    st.integers(-(10**6), 4 * 10**15),
    st.integers(-(10**6), 2**33 * 10**6),
    st.integers(2**32 * 10**6 - 5, 2**32 * 10**6 + 5),
    st.sampled_from([253402300799_999999, 253402300800_000000, 1_764_650_000_123_456]),
)
_VALUE_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "string": (pa.string(), _text),
    "binary": (pa.binary(), st.binary(max_size=300)),
    "bool": (pa.bool_(), st.booleans()),
    "byte": (pa.int8(), st.integers(-128, 127)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "long": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": (pa.float32(), st.floats(width=32)),
    "double": (pa.float64(), st.floats()),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(datetime.UTC))),
}


@st.composite
def batches(draw: Any) -> tuple[pa.RecordBatch, str]:
    n = draw(st.integers(1, 6))
    table: dict[str, pa.Array] = {"body": pa.array([draw(st.binary(max_size=300)) for _ in range(n)], pa.binary())}
    for name in draw(st.lists(st.sampled_from(STRING_PROPERTIES), unique=True, max_size=len(STRING_PROPERTIES))):
        table[name] = pa.array([draw(st.one_of(st.none(), _OWN_TEXT.get(name, _text))) for _ in range(n)], pa.string())
    for name in draw(st.lists(st.sampled_from(["priority", "delivery_mode"]), unique=True)):
        table[name] = pa.array([draw(st.one_of(st.none(), _OCTETS[name])) for _ in range(n)], pa.int32())
    if draw(st.booleans()):
        if draw(st.booleans()):
            table["timestamp"] = pa.array([draw(st.one_of(st.none(), _seconds)) for _ in range(n)], pa.int64())
        else:
            kind = pa.timestamp("us", tz=draw(st.sampled_from([None, "UTC", "Europe/Paris"])))
            table["timestamp"] = pa.array([draw(st.one_of(st.none(), _micros)) for _ in range(n)], pa.int64()).cast(kind)
    if draw(st.booleans()):
        value_type, values = _VALUE_TYPES[draw(st.sampled_from(sorted(_VALUE_TYPES)))]
        keys = st.one_of(st.sampled_from(["tenant", "region", "trace_id"]), _short, _text)
        entries = st.tuples(keys, st.one_of(st.none(), values))
        # Repeated keys (which Python's dict merges) in one map of four.
        maps = st.one_of(st.none(), *[st.lists(entries, max_size=4, unique_by=lambda kv: kv[0])] * 3, st.lists(entries, max_size=4))
        table["headers"] = pa.array([draw(maps) for _ in range(n)], pa.map_(pa.string(), value_type))
    routes = st.one_of(st.none(), st.text(max_size=8))
    for name in draw(st.lists(st.sampled_from(["exchange", "routing_key", "filter_value"]), unique=True)):
        table[name] = pa.array([draw(routes) for _ in range(n)], pa.string())
    batch = pa.RecordBatch.from_pydict(table)
    skip = draw(st.integers(0, n - 1))  # a slice: the columns' own offsets
    return batch.slice(skip), draw(st.sampled_from(SINKS))


def _builder(sink: str, version: tuple[int, int], persistent: bool) -> Any:
    if sink == "stream":
        options = parse_sink_options({"uri": "rabbitmq-stream://127.0.0.1:1", "stream": "s", "persistent": str(persistent).lower()})
        stream = StreamMessageBuilder(options, producer_for("p", 0, None))
        stream.met_stream_broker(version, 1 << 20)
        return stream.stream_messages
    if sink == "amqp":
        basic = MessageBuilder(parse_sink_options({"uri": "amqp://127.0.0.1:1", "routingKey": "q", "persistent": str(persistent).lower()}))
        basic.met(version)
        return lambda batch: list(basic.messages(batch))
    options = parse_sink_options({"uri": "amqp://127.0.0.1:1", "protocol": "amqp1.0", "persistent": str(persistent).lower()})
    amqp10 = Amqp10MessageBuilder(options)
    amqp10.met_amqp10_broker(version, version != (3, 13), 1 << 20)  # one of them as another broker (Artemis)
    return amqp10.amqp10_messages


def _outcome(sink: str, version: tuple[int, int], persistent: bool, batch: pa.RecordBatch) -> Any:
    try:
        return [m if isinstance(m, Outgoing) else tuple(m) for m in _builder(sink, version, persistent)(batch)]
    except (AmqpOptionError, UnicodeEncodeError, OverflowError, ValueError) as err:
        return type(err), str(err)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches(), st.sampled_from(VERSIONS), st.booleans())
def test_the_core_writes_what_python_writes(drawn: tuple[pa.RecordBatch, str], version: tuple[int, int], persistent: bool) -> None:
    batch, sink = drawn
    took: list[bool] = []
    real, real_headers = core_records.amqp10_records, core_records.basic_headers

    def counted(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        took.append(made is not None)
        return made

    def counted_headers(*args: Any, **kwargs: Any) -> Any:
        made = real_headers(*args, **kwargs)
        took.append(made is not None)
        return made

    with pytest.MonkeyPatch.context() as m:
        m.setattr("spark_amqp.sink.stream_messages.amqp10_records", counted)
        m.setattr("spark_amqp.sink.amqp10_messages.amqp10_records", counted)
        m.setattr("spark_amqp.sink.columns.basic_headers", counted_headers)
        compiled = _outcome(sink, version, persistent, batch)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(core, "CORE", None)
        python = _outcome(sink, version, persistent, batch)
    event(f"{sink}: " + ("the core wrote the batch" if took == [True] else "left to Python"))
    if took == [True]:
        assert isinstance(python, list), f"the core wrote a batch Python refuses: {python}"
    assert compiled == python


def test_the_core_writes_producer_like_batches_itself() -> None:
    """The differential test's batches are mostly ones the core leaves to Python (a bad value in any row); the
    messages producers send are the core's, and the same bytes as Python's."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    try:
        import shapes  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    batch = next(shapes.arrow_batches("producer-like", 500))
    columns = {name: batch.column(name) for name in batch.schema.names}
    assert core_records.basic_headers(columns, batch.num_rows, None, True) is not None
    for sink in SINKS:
        for version in VERSIONS:
            bodies = columns["body"].to_pylist()
            assert core_records.amqp10_records(columns, bodies, _conversion(version), True) is not None
            assert _outcome(sink, version, True, batch) == _python(sink, version, batch)


def _conversion(version: tuple[int, int]) -> Any:
    from spark_amqp.stream_protocol.rows import Conversion

    return Conversion.of(version)


def _python(sink: str, version: tuple[int, int], batch: pa.RecordBatch) -> Any:
    saved = core.CORE
    core.CORE = None
    try:
        return _outcome(sink, version, True, batch)
    finally:
        core.CORE = saved
