"""What a query wrote with Spark's parquet file sink, read back with the source's schema."""

from __future__ import annotations

import glob

from spark_amqp.reading.arrow import SCHEMA_DDL


def rows_written(spark, path) -> list:  # type: ignore[no-untyped-def,type-arg]
    """The rows in the file sink at ``path`` (none before its first file)."""
    if not glob.glob(f"{path}/*.parquet"):
        return []
    # The file sink's own log decides which files are committed; the schema is the source's.
    return spark.read.schema(SCHEMA_DDL).parquet(str(path)).collect()
