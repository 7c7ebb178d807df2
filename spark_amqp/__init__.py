"""spark-amqp: RabbitMQ / AMQP 0-9-1 connector for PySpark Structured Streaming."""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from typing import Any

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

    It also makes ``spark`` the active session of the calling thread (classic Spark): call it
    in every thread of your own that runs ``df.write`` or ``writeStream`` with ``format("amqp")``.
    """
    # Imported here so that `import spark_amqp` (and its version) works without PySpark.
    from .datasource import AmqpDataSource

    try:
        spark.dataSource.register(AmqpDataSource)
    except Exception as e:
        # Spark 4.0 (not 4.1+) refuses to replace a data source that auto-registration found
        # (DataSourceManager.registerDataSource): when pyspark_amqp is importable, that is this one.
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(e) or find_spec("pyspark_amqp") is None:
            raise
    # Classic Spark's writers (df.write.save, writeStream.start; not the readers) find a Python
    # data source through the JVM's *active* session, a thread-local (DataSource.lookupDataSource:
    # SparkSession.getActiveSession), not through the DataFrame's session. PySpark pins each
    # Python thread to a JVM thread of its own, where no session is active: from a thread of the
    # user's the write fails with DATA_SOURCE_NOT_FOUND (amqp.DefaultSource), registered or
    # auto-registered alike. Set it for this thread, as PySpark's createDataFrame does. Spark
    # Connect sessions have no _jsparkSession (its server runs each command in its session).
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is not None:
        try:
            type(spark)._get_j_spark_session_class(spark._jvm).setActiveSession(jsession)
        except Exception as err:  # e.g. py4j calls not allowed (Databricks table ACLs): registered all the same
            logging.getLogger("spark_amqp").debug("spark_amqp.register: this thread's active session not set: %s", err)
