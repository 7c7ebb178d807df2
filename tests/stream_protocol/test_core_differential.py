"""The compiled core against the pure-Python path, on random and malformed chunks (hypothesis): for every chunk the
core takes, its Arrow data equals Python's (``RowMaker`` + ``arrow.to_stream_batch``, the range and the row filter
applied as ``range_over_protocol`` does); a chunk it leaves to Python adds nothing, and Python then makes its rows or
raises its own error. The tests run on the core ``make install`` builds with overflow checks and debug assertions
(Cargo profile ``checked``): a read past a buffer is impossible in its safe code, and an overflow is a panic, which the
core turns into a chunk left to Python (so a test that reached one fails here on the row count, not silently).
Example counts are bounded to keep the file under a minute; ``CORE_EXAMPLES`` raises them for a longer run."""

from __future__ import annotations

import os
import struct
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (the test extra and the Makefile's venvs have it)")
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_amqp.amqp10.types import Described, Opaque, Symbol, Timestamp, UInt, encode
from spark_amqp.reading import arrow
from spark_amqp.reading.projection import Projection
from spark_amqp.stream_protocol import chunks, core
from spark_amqp.stream_protocol.rows import Conversion, RowMaker
from spark_amqp.streams.filtering import RowFilter
from spark_amqp.streams.held import to_batch

pytestmark = pytest.mark.skipif(core.CORE is None, reason=f"no compiled core to compare: {core.PATH}")

EXAMPLES = int(os.environ.get("CORE_EXAMPLES", "2000"))
SCHEMA = arrow.STREAM_ARROW_SCHEMA


def packed(code: int, fmt: str, lo: int, hi: int) -> st.SearchStrategy[Opaque]:
    return st.integers(lo, hi).map(lambda v: Opaque(code, struct.pack(fmt, v)))


def raw_symbol(raw: bytes) -> Opaque:
    return Opaque(0xA3, bytes([len(raw)]) + raw)


def raw_string(raw: bytes) -> Opaque:  # bytes that may not be UTF-8, with a string's type code
    return Opaque(0xA1, bytes([len(raw)]) + raw)


_tame = [
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    packed(0x50, ">B", 0, 255),
    packed(0x51, ">b", -128, 127),
    packed(0x52, ">B", 0, 255),
    packed(0x54, ">b", -128, 127),
    packed(0x55, ">b", -128, 127),
    packed(0x56, ">B", 0, 3),
    packed(0x60, ">H", 0, 2**16 - 1),
    packed(0x61, ">h", -(2**15), 2**15 - 1),
    packed(0x70, ">I", 0, 2**32 - 1),
    packed(0x71, ">i", -(2**31), 2**31 - 1),
    packed(0x81, ">q", -(2**63), 2**63 - 1),
    st.sampled_from([Opaque(0x43, b""), Opaque(0x44, b"")]),
    st.floats(),
    st.floats(width=32).map(lambda f: Opaque(0x72, struct.pack(">f", f))),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    st.integers(-62135596800000, 253402300799999).map(Timestamp),
    st.uuids(),
    st.binary(max_size=40),
    st.binary(min_size=256, max_size=300),
    st.text(max_size=30),
    st.text(min_size=100, max_size=120),  # past 255 bytes sometimes (0xb1)
    st.text(st.characters(max_codepoint=127), max_size=20).map(Symbol),
    st.binary(min_size=4, max_size=4).map(lambda b: Opaque(0x73, b)),
    st.binary(min_size=4, max_size=4).map(lambda b: Opaque(0x74, b)),
    st.binary(min_size=8, max_size=8).map(lambda b: Opaque(0x84, b)),
    st.binary(min_size=16, max_size=16).map(lambda b: Opaque(0x94, b)),
]
tame_scalars = st.one_of(*_tame)
scalars = st.one_of(*_tame, st.binary(max_size=12).map(raw_symbol), st.binary(max_size=12).map(raw_string))
descriptors = st.one_of(st.integers(0, 300), st.text(st.characters(max_codepoint=127), max_size=8).map(Symbol))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3), st.builds(Described, descriptors, inner)
    ),
    max_leaves=4,
)
FILTER_VALUES = ["eu", "us", "", "é"]
filter_values = st.one_of(st.sampled_from(FILTER_VALUES), st.sampled_from(FILTER_VALUES).map(str.encode), scalars)
KEYS = ["x-exchange", "x-routing-key", "x-basic-type", "x-basic-priority", "x-stream-offset", "x-opt-a", "tenant", "k"]
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6))
symbol_keys = st.one_of(st.sampled_from(KEYS), st.text(st.characters(max_codepoint=127), max_size=6)).map(Symbol)
FILTER_KEY = "x-stream-filter-value"


def pairs_map(pairs: list[tuple[Any, Any]]) -> Opaque:
    """A map from pairs, duplicate keys and all (a dict cannot hold them)."""
    body = b"".join(encode(k) + encode(v) for k, v in pairs)
    n = 2 * len(pairs)
    if len(body) + 1 < 256 and n < 256:
        return Opaque(0xC1, bytes([len(body) + 1, n]) + body)
    return Opaque(0xD1, struct.pack(">II", len(body) + 4, n) + body)


header = st.one_of(
    st.just(Opaque(0x45, b"")),
    st.none(),
    st.lists(st.one_of(st.none(), st.booleans(), packed(0x50, ">B", 0, 255), st.integers(0, 2**32 - 1).map(UInt), scalars), max_size=5),
)
entry = st.one_of(st.tuples(st.one_of(keys, symbol_keys, st.integers(0, 3)), values), st.tuples(st.just(FILTER_KEY), filter_values))
annotations = st.one_of(
    st.none(),
    st.lists(st.one_of(st.tuples(st.one_of(symbol_keys, keys, st.integers(0, 9)), values), entry), max_size=5).map(pairs_map),
)
properties = st.one_of(st.none(), st.lists(st.one_of(st.none(), st.none(), scalars, values), min_size=0, max_size=14))
app_props = st.one_of(st.none(), st.lists(entry, max_size=5).map(pairs_map))
bodies = st.one_of(
    st.tuples(st.just(0x75), st.binary(max_size=300)),
    st.tuples(st.just(0x75), st.text(max_size=5)),
    st.tuples(st.just(0x77), scalars),
    st.tuples(st.just(0x76), st.lists(scalars, max_size=2)),
    st.just(None),
)

# What the core is meant to take: scalars it renders, the sections in order, nothing damaged.
tame_header = (
    st.lists(st.one_of(st.none(), st.booleans()), max_size=1)
    .flatmap(
        lambda d: st.tuples(
            st.just(d), st.one_of(st.none(), packed(0x50, ">B", 0, 255)), st.one_of(st.none(), st.integers(0, 2**32 - 1).map(UInt))
        )
    )
    .map(lambda t: [*(t[0] or [None]), t[1], t[2]])
)
tame_annotations = st.one_of(st.none(), st.dictionaries(symbol_keys, tame_scalars, max_size=4))
tame_properties = st.one_of(st.none(), st.lists(st.one_of(st.none(), tame_scalars), max_size=13))
tame_entry = st.one_of(st.tuples(keys, tame_scalars), st.tuples(st.just(FILTER_KEY), st.sampled_from(FILTER_VALUES)))
tame_apps = st.one_of(st.none(), st.lists(tame_entry, max_size=5).map(pairs_map))


def section(code: int, value: Any) -> bytes:
    return b"\x00\x53" + bytes([code]) + encode(value)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=30))  # not AMQP 1.0, mostly
    wild = draw(st.booleans())
    strategies = (
        (header, st.none(), annotations, properties, app_props)
        if wild
        else (tame_header, st.none(), tame_annotations, tame_properties, tame_apps)
    )
    parts = []
    for code, strategy in zip((0x70, 0x71, 0x72, 0x73, 0x74), strategies, strict=True):
        v = draw(strategy)
        if v is not None or draw(st.integers(0, 9)) == 0:
            parts.append(section(code, v))
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 2, 0]))):
        b = draw(bodies)
        if b is not None:
            parts.append(section(*b))
    if draw(st.integers(0, 9)) == 0:
        parts.append(section(0x78, {Symbol("f"): 1}))  # a footer
    if wild and draw(st.integers(0, 9)) == 0:
        parts = draw(st.permutations(parts))
    record = b"".join(parts)
    if wild and record and draw(st.integers(0, 9)) == 0:  # damaged: a byte changed, or cut short
        i = draw(st.integers(0, len(record) - 1))
        record = record[:i] + bytes([draw(st.integers(0, 255))]) + record[i + 1 :] if draw(st.booleans()) else record[:i]
    return record


@st.composite
def damaged(draw: st.DrawFn, chunk: bytes) -> bytes:
    """A chunk as a broken or hostile peer might send it: cut short, a byte changed (its CRC made right or not)."""
    kind = draw(st.sampled_from(["whole", "whole", "whole", "cut", "byte", "byte-crc"]))
    if kind == "cut":
        return chunk[: draw(st.integers(0, len(chunk) - 1))]
    if kind == "whole":
        return chunk
    i = draw(st.integers(0, len(chunk) - 1))
    out = bytearray(chunk)
    out[i] = draw(st.integers(0, 255))
    if kind == "byte-crc" and len(out) >= chunks.HEADER.size:
        import zlib

        size = min(int.from_bytes(out[36:40], "big"), len(out) - 48)
        out[32:36] = zlib.crc32(out[48 : 48 + size]).to_bytes(4, "big")
    return bytes(out)


def python_table(
    chunk: bytes, conv: Conversion, skip: int, stop: int, row_filter: RowFilter | None, columns: Projection | None = None
) -> pa.Table | BaseException:
    """What range_over_protocol's Python path makes of the chunk's records ``skip..stop``, or the error it meets."""
    try:
        h = chunks.read_header(chunk)
        recs = chunks.records(chunk, h)
        maker = RowMaker("s", conv, None if columns is None else columns.made(row_filter is not None))
        rows = [maker.row(recs[i], h.first_offset + i) for i in range(skip, min(stop, len(recs)))]
        if row_filter is not None:
            rows = [r for r in rows if row_filter.keeps(r[5])]
        schema = SCHEMA if columns is None else columns.schema
        return pa.Table.from_batches([arrow.to_stream_batch(rows, columns)]) if rows else schema.empty_table()
    except Exception as err:  # the Python path refuses the chunk: the core must have left it to Python
        return err


def core_table(builder: Any, columns: Projection | None = None) -> pa.Table:
    batch = to_batch(builder.finish(), columns)
    batch.validate(full=True)
    return pa.Table.from_batches([batch])


filters = st.one_of(st.none(), st.tuples(st.sets(st.sampled_from(FILTER_VALUES), min_size=1), st.booleans()))
# A query's .schema(): some of the columns, in any order (none: every column); body + offset often, the case that
# decodes nothing before the body.
projections = st.one_of(
    st.none(),
    st.just(("body", "offset")),
    st.lists(st.sampled_from(SCHEMA.names), min_size=1, max_size=6, unique=True).map(tuple),
).map(lambda names: None if names is None else Projection("stream", names, names, (False,) * len(names)))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    st.lists(records(), min_size=1, max_size=3).flatmap(lambda recs: st.tuples(st.just(recs), st.integers(0, 2**40))),
    st.sampled_from([(4, 0), (4, 1), (4, 3)]),
    st.sampled_from([0, 0, 0, 1, 2]),
    st.sampled_from([1, 1, 2, 3, 4, 0, 1 << 40]),
    filters,
    projections,
    st.data(),
)
def test_the_core_makes_the_rows_python_makes(
    recs_first: tuple[list[bytes], int],
    version: tuple[int, int],
    skip: int,
    span: int,
    kept: Any,
    columns: Projection | None,
    data: st.DataObject,
) -> None:
    recs, first = recs_first
    chunk = data.draw(damaged(chunks.build(first, recs, 1_700_000_000_000)))
    conv = Conversion.of(version)
    row_filter = None if kept is None else RowFilter(tuple(kept[0]), kept[1])
    made = None if columns is None else columns.made(kept is not None)
    builder = core.builder("s", conv, None if kept is None else kept[0], bool(kept and kept[1]), made)
    stop = skip + span
    if builder.add(chunk, skip, stop) is None:
        event(f"left to Python: {builder.fallback}")
        assert builder.rows == 0
        return
    event("taken by the core" + (" (some columns)" if columns else ""))
    want = python_table(chunk, conv, skip, stop, row_filter, columns)
    assert isinstance(want, pa.Table), f"the core took a chunk the Python path refuses: {want!r}"
    got = core_table(builder, columns)
    assert got.schema.equals(want.schema) and got.equals(want), (got.to_pylist(), want.to_pylist())


def test_a_chunk_left_to_python_keeps_the_rows_before_it() -> None:
    good = chunks.build(0, [b"\x00\x53\x75\xa0\x01x"], 0)
    bad = chunks.build(1, [b"\x00\x53\x75\xa0\x01x", b"\x00\x53\x77\xe0\x01\x00"], 0)  # an array: left to Python
    builder = core.builder("s", Conversion.of((4, 3)), None, False)
    assert builder.add(good, 0, 9) == 1 and builder.add(bad, 0, 9) is None and builder.add(good, 0, 9) == 1
    assert core_table(builder).column("body").to_pylist() == [b"x", b"x"]


def test_three_x_and_no_core_leave_every_chunk_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    assert core.builder("s", Conversion.of((3, 10)), None, False) is None
    monkeypatch.setattr(core, "CORE", None)
    assert core.builder("s", Conversion.of((4, 3)), None, False) is None
