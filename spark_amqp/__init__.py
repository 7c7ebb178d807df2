"""spark-amqp: RabbitMQ / AMQP 0-9-1 connector for PySpark Structured Streaming."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from . import pamqp_fixes  # noqa: F401  (before any module encodes a field table)

try:
    __version__ = version("spark-amqp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "register"]


def register(spark: Any) -> None:
    """Registers ``format("amqp")`` with ``spark`` (a classic or a Spark Connect session).

    Spark finds the connector by itself when the ``pyspark_amqp`` module is importable by
    the Python it starts for its workers, once per JVM. Call this where that lookup cannot
    see the package: a notebook-scoped ``%pip`` install, an editable install, another
    ``PYSPARK_PYTHON``. Registering twice is harmless.
    """
    # Imported here so that `import spark_amqp` (and its version) works without PySpark.
    from .datasource import AmqpDataSource

    spark.dataSource.register(AmqpDataSource)
