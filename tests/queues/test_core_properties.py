"""The compiled core's AMQP 0-9-1 property columns against the pure-Python path, on random and damaged content
headers (hypothesis): ``arrow.to_record_batch`` gives equal Arrow tables with the core (``reading.core_properties``)
and without it (``core.CORE`` None), every column or some of them in any order. A batch the core leaves to Python
(nested tables, decimals, truncated headers ...) is Python's on both sides, so the check that the core takes the
well-formed headers it should is a test of its own. Runs on the ``checked`` build (make install), where an overflow
panics; a panic leaves the batch to Python, which the tame test sees. ``CORE_EXAMPLES`` raises the example counts."""

from __future__ import annotations

import os
import struct

import pyarrow as pa
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (the test extra and the Makefile's venvs have it)")
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from spark_amqp.client.properties import LazyProperties
from spark_amqp.reading import arrow
from spark_amqp.reading.projection import Projection
from spark_amqp.stream_protocol import core

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

EXAMPLES = int(os.environ.get("CORE_EXAMPLES", "700"))
MAX_TIMESTAMP = 253402300799
_FIXED = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"f": 4, b"l": 8, b"L": 8, b"d": 8}
_KEYS = ["a", "b", "x-count", "ü", "k" * 40, ""]


def _long(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _texts(max_size: int) -> st.SearchStrategy[bytes]:
    return st.text(max_size=max_size).map(str.encode)


@st.composite
def field_value(draw: st.DrawFn, tame: bool, depth: int = 0) -> bytes:
    kinds = [*_FIXED, b"T", b"V", b"S", b"x"]
    if not tame:
        kinds += [b"D", b"F", b"A", b"?"] if depth < 2 else [b"D", b"?"]
    kind = draw(st.sampled_from(kinds))
    if kind in _FIXED:
        return kind + draw(st.binary(min_size=_FIXED[kind], max_size=_FIXED[kind]))
    if kind == b"T":
        seconds = draw(st.integers(0, MAX_TIMESTAMP) if tame else st.one_of(st.integers(0, MAX_TIMESTAMP + 2), st.integers(0, 2**64 - 1)))
        return kind + struct.pack(">Q", seconds)
    if kind == b"V":
        return kind
    if kind in (b"S", b"x"):
        return kind + _long(draw(st.one_of(_texts(20), st.binary(max_size=20))))
    if kind == b"D":
        return kind + draw(st.binary(min_size=5, max_size=5))
    if kind == b"F":
        return kind + _long(draw(table_entries(tame, depth + 1)))
    if kind == b"A":
        return kind + _long(b"".join(draw(st.lists(field_value(tame, depth + 1), max_size=3))))
    return draw(st.sampled_from([b"?", b"\x00", b"U", b"c"]))  # a field type Python does not know


@st.composite
def table_entries(draw: st.DrawFn, tame: bool, depth: int = 0) -> bytes:
    if tame:
        keys = draw(st.lists(st.one_of(st.sampled_from(_KEYS), st.text(max_size=12)), max_size=5, unique_by=str.encode))
        raw_keys = [k.encode() for k in keys]
    else:
        raw_keys = draw(st.lists(st.one_of(st.sampled_from(_KEYS).map(str.encode), st.binary(max_size=6)), max_size=5))
    out = b""
    for key in raw_keys:
        key = key[:255]
        out += bytes([len(key)]) + key + draw(field_value(tame, depth))
    return out


@st.composite
def content_header(draw: st.DrawFn, tame: bool) -> bytes:
    flags = draw(st.integers(0, 0xFFFF)) & ~1
    values = b""
    for i in range(14):
        if not flags & (1 << (15 - i)):
            continue
        if i == 2:
            values += _long(draw(table_entries(tame)))
        elif i in (3, 4):
            values += bytes([draw(st.integers(0, 255))])
        elif i == 9:
            seconds = draw(
                st.integers(0, MAX_TIMESTAMP) if tame else st.sampled_from([0, 1_700_000_000, MAX_TIMESTAMP, MAX_TIMESTAMP + 1, 2**64 - 1])
            )
            values += struct.pack(">Q", seconds)
        else:
            raw = draw(_texts(20) if tame else st.one_of(_texts(20), st.binary(max_size=12)))[:255]
            values += bytes([len(raw)]) + raw
    header = struct.pack(">HHQH", 60, 0, draw(st.integers(0, 2**20)), flags) + values
    if tame:
        return header
    damage = draw(st.sampled_from(["whole", "whole", "whole", "cut", "byte", "more", "continued", "short"]))
    if damage == "cut":
        return header[: draw(st.integers(0, len(header)))]
    if damage == "byte":
        i = draw(st.integers(0, len(header) - 1))
        return header[:i] + bytes([draw(st.integers(0, 255))]) + header[i + 1 :]
    if damage == "more":
        return header + draw(st.binary(min_size=1, max_size=8))
    if damage == "continued":  # a continued flag word, then another
        return header[:12] + struct.pack(">HH", flags | 1, draw(st.integers(0, 0xFFFF))) + values
    return header[: draw(st.integers(0, 14))]


def queue_table(headers: list[bytes], columns: Projection | None, use_core: bool) -> pa.Table:
    rows = [("s.1", "q", i, False, "x", "rk", LazyProperties(h), b"body") for i, h in enumerate(headers)]
    saved = core.CORE
    core.CORE = saved if use_core else None
    try:
        batch = arrow.to_record_batch(rows, columns)
    finally:
        core.CORE = saved
    batch.validate(full=True)
    return pa.Table.from_batches([batch])


projections = st.one_of(
    st.none(),
    st.lists(st.sampled_from(arrow.ARROW_SCHEMA.names), min_size=1, max_size=8, unique=True).map(tuple),
    st.lists(st.sampled_from(arrow.PROPERTY_COLUMNS), min_size=1, max_size=4, unique=True).map(tuple),
).map(lambda names: None if names is None else Projection("queue", names, names, (False,) * len(names)))


def _property_names(columns: Projection | None) -> list[str]:
    return list(arrow.PROPERTY_COLUMNS if columns is None else columns.properties)


def _compare(headers: list[bytes], columns: Projection | None) -> bool:
    """Equal tables on both paths; whether the core took the batch."""
    wanted = _property_names(columns)
    taken = bool(wanted) and core.CORE.basic_properties(headers, wanted) is not None
    want, got = queue_table(headers, columns, False), queue_table(headers, columns, True)
    assert got.equals(want), f"{headers!r}\n{got.to_pylist()}\n!=\n{want.to_pylist()}"
    return taken


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(content_header(tame=False), min_size=1, max_size=5), projections)
def test_the_core_makes_the_property_columns_python_makes(headers: list[bytes], columns: Projection | None) -> None:
    event("taken by the core" if _compare(headers, columns) else "Python's")


# Floats with two shortest forms as near (Python's repr takes the even one): once found by this test at 5,000 examples.
_TIES = struct.pack(">HHQH", 60, 0, 1, 1 << 13) + _long(b"\x01afC\x00\x00\x02\x01bd" + struct.pack(">d", 996.04693603515625))


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@example([_TIES, _TIES[:12] + b"\x00\x00"], None)
@given(st.lists(content_header(tame=True), min_size=2, max_size=5), projections)
def test_the_core_takes_every_well_formed_header_it_renders(headers: list[bytes], columns: Projection | None) -> None:
    if len(set(h[12:] for h in headers)) == 1:
        headers = [*headers, headers[0][:12] + b"\x00\x00"]  # not one shared property list: the Python shortcut
    assert _compare(headers, columns) or not _property_names(columns)


@pytest.mark.parametrize(
    ("flags", "values", "taken", "raw"),
    [
        (1 << 15, b"\x02\xff\xfe", True, True),  # content_type not UTF-8: None, raw header kept
        (1 << 6, struct.pack(">Q", MAX_TIMESTAMP + 1), True, True),  # timestamp past 9999
        (1 << 2, b"\x02\xc3\x28", True, True),  # cluster_id not UTF-8: no column of its own, still the raw header
        (1 << 13, _long(b"\x01tT" + struct.pack(">Q", 2**63)), True, True),  # a header timestamp past 9999: null value
        (1 << 13, _long(b"\x01dD\x02\x00\x00\x00\x96"), False, False),  # a decimal: Python's
        (1 << 13, _long(b"\x01aF" + _long(b"")), False, False),  # a nested table: Python's
        (1 << 13, _long(b"\x01aI\x00\x00\x00\x01\x01aI\x00\x00\x00\x02"), False, False),  # a repeated key: Python's
        (1 << 13, _long(b"\x01\xffV"), False, True),  # a key that is not UTF-8: Python's
        (1 << 13 | 1, _long(b""), False, True),  # a continued flag word: Python's
        (1 << 15, b"\x09abc", False, True),  # truncated: Python's
    ],
)
def test_poison_values_and_what_is_left_to_python(flags: int, values: bytes, taken: bool, raw: bool) -> None:
    header = struct.pack(">HHQH", 60, 0, 5, flags) + values
    headers = [header, struct.pack(">HHQH", 60, 0, 0, 1 << 3) + b"\x02id"]
    assert _compare(headers, None) is taken
    assert (queue_table(headers, None, True).column("raw_header")[0].as_py() == header) is raw


def test_an_already_decoded_message_is_left_to_python() -> None:
    tables = [_long(b"\x0fx-stream-offsetl" + struct.pack(">q", 7) + b"\x01aS" + _long(b"b"))]
    header = struct.pack(">HHQH", 60, 0, 1, 1 << 13) + tables[0]
    lazy = [LazyProperties(header), LazyProperties(header[:12] + b"\x00\x00")]
    lazy[0].text_header("a")  # found in place, nothing decoded
    assert all(p.core_header is not None for p in lazy)
    lazy[0].long_header("missing")
    lazy[0].arrow_row()  # decoded now: Python's from here on
    assert lazy[0].core_header is None


def test_a_panic_or_a_bad_column_name_never_ends_the_worker() -> None:
    with pytest.raises(ValueError, match="body"):
        core.CORE.basic_properties([b""], ["body"])
    assert core.CORE.basic_properties([], ["headers"]) is not None
