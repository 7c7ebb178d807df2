"""The columns a query asks for: ``.schema(...)`` on the reader, checked against the source's, and kept as a
``Projection`` the reading paths make their batches of.

Spark hands a Python data source the schema the user gave the reader (``DataSource.reader(schema)``,
``streamReader(schema)``), or the source's own when none was given; there is no column pruning for Python data sources
(PySpark 4.0 to 4.3), so a schema is the only way a query says which columns it needs. A schema that names some of the
source's columns, with their types, is a projection: batches hold exactly those columns in the declared order, under
the declared names, and the readers leave the rest undecoded. Names match whatever their case, as Spark resolves
columns by default (``spark.sql.caseSensitive`` off); the batches use the declared spelling, which PySpark checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import AmqpOptionError
from . import arrow

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = ["Projection", "projection"]

# Set on every row: they may be declared NOT NULL. Every other column is null for some message.
NEVER_NULL = frozenset({"body", "queue", "delivery_tag", "redelivered", "offset"})
_SOURCES = {"queue": arrow.ARROW_SCHEMA, "stream": arrow.STREAM_ARROW_SCHEMA}


@dataclass(frozen=True)
class Projection:
    """Some of the source's columns, in the order a query declared them."""

    mode: str  # "queue" or "stream": which source schema
    names: tuple[str, ...]  # the source's column names
    labels: tuple[str, ...]  # as declared (the batches' field names)
    required: tuple[bool, ...]  # declared NOT NULL

    @cached_property
    def schema(self) -> pa.Schema:
        """The batches' Arrow schema: the source's types, the declared names and nullability (PySpark 4.3 compares
        a batch's schema with the declared one, names and nullability included)."""
        source = _SOURCES[self.mode]
        fields = zip(self.names, self.labels, self.required, strict=True)
        return pa.schema([pa.field(label, source.field(name).type, nullable=not required) for name, label, required in fields])

    @cached_property
    def properties(self) -> tuple[str, ...]:
        """The property columns asked for, in the declared order (none: no message's properties are decoded)."""
        return tuple(n for n in self.names if n in arrow.PROPERTY_COLUMNS)

    def made(self, filtering: bool) -> tuple[str, ...]:
        """The columns a stream reader makes: those asked for, and ``headers`` where a row filter reads them (the filter
        value is a header, converted as the column is)."""
        return (*self.names, "headers") if filtering and "headers" not in self.names else self.names

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch of the source's columns (every one, as queue mode's journal keeps them; or these already) as this
        projection's."""
        if batch.schema.names == list(self.labels):
            return batch
        return pa.RecordBatch.from_arrays([batch.column(n) for n in self.names], schema=self.schema)


def projection(schema: StructType | None, mode: str) -> Projection | None:
    """The columns ``schema`` asks of the source in ``mode`` ("queue" or "stream"); None for every column, in the
    source's order (no schema given, or the source's own). ``AmqpOptionError`` naming the column otherwise."""
    if schema is None:
        return None
    from pyspark.sql.types import StructType

    if not isinstance(schema, StructType):
        raise AmqpOptionError(f"schema: a struct of columns is needed, got {type(schema).__name__}")
    source = _SOURCES[mode]
    by_name = {n.lower(): n for n in source.names}
    names: list[str] = []
    seen: dict[str, str] = {}
    for field in schema.fields:
        name = by_name.get(field.name.lower())
        if name is None:
            raise AmqpOptionError(_unknown(field.name, mode))
        if name in seen:
            raise AmqpOptionError(
                f"schema: column '{field.name}' is declared twice ('{seen[name]}' and '{field.name}': Spark matches column "
                "names whatever their case)"
            )
        seen[name] = field.name
        want = _spark_type(source.field(name).type)
        if field.dataType != want:
            # Where spark.sql.timestampType is TIMESTAMP_NTZ, TIMESTAMP means that: TIMESTAMP_LTZ is the source's either way.
            ddl = "TIMESTAMP_LTZ" if field.dataType.typeName() == "timestamp_ntz" else _ddl(want)
            raise AmqpOptionError(
                f"schema: column '{field.name}' must be {_ddl(want)} (what the source makes of it), not {_ddl(field.dataType)}: "
                f"declare it `{field.name} {ddl}` and cast it after load() for another type"
            )
        if not field.nullable and name not in NEVER_NULL:
            raise AmqpOptionError(
                f"schema: column '{field.name}' is null for messages without it: declare it without NOT NULL (only "
                f"{', '.join(n for n in source.names if n in NEVER_NULL)} are never null)"
            )
        names.append(name)
    if not names:
        raise AmqpOptionError(f"schema: no columns; name at least one of the source's: {', '.join(source.names)}")
    labels = tuple(f.name for f in schema.fields)
    required = tuple(not f.nullable for f in schema.fields)
    if tuple(names) == tuple(source.names) and labels == tuple(names) and not any(required):
        return None
    return Projection(mode, tuple(names), labels, required)


def _unknown(column: str, mode: str) -> str:
    other = "stream" if mode == "queue" else "queue"
    theirs = {n.lower() for n in _SOURCES[other].names} - {n.lower() for n in _SOURCES[mode].names}
    option = {"queue": "option 'queue'", "stream": "option 'stream' or 'superStream'"}
    why = (
        f"'{column}' is a {other}'s ({option[other]}), not a {mode}'s"
        if column.lower() in theirs
        else f"'{column}' is not a column of this source"
    )
    return (
        f"schema: column {why}. A {mode}'s columns ({option[mode]}): {', '.join(_SOURCES[mode].names)}. Give .schema() "
        "some of them, with their types, or leave it out for all"
    )


def _spark_type(kind: pa.DataType) -> DataType:
    from pyspark.sql import types as t

    if pa.types.is_map(kind):
        return t.MapType(t.StringType(), t.StringType(), True)
    if pa.types.is_timestamp(kind):
        return t.TimestampType()
    simple: dict[Any, DataType] = {
        pa.binary(): t.BinaryType(),
        pa.string(): t.StringType(),
        pa.int64(): t.LongType(),
        pa.int32(): t.IntegerType(),
        pa.bool_(): t.BooleanType(),
    }
    return simple[kind]


def _ddl(kind: DataType) -> str:
    return kind.simpleString().upper()
