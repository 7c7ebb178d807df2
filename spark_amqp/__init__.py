"""spark-amqp: a PySpark Structured Streaming source and sink for AMQP brokers.

It speaks AMQP 0-9-1 (RabbitMQ), AMQP 1.0 (RabbitMQ 4 and ActiveMQ Artemis: option
``protocol=amqp1.0``) and RabbitMQ's stream protocol (a ``rabbitmq-stream://`` uri), as Spark 4's
Python data source ``format("amqp")``: queues and RabbitMQ streams in, messages out.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from typing import Any

try:
    __version__ = version("spark-amqp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "register", "rows_path"]


def rows_path() -> str:
    """Which path makes a stream source's rows in this Python: ``"rows: compiled core (spark-amqp-core 0.1.0, Rust)"``,
    or ``"rows: pure Python (...)"`` saying why (docs/compiled-core.md). Spark's ``explain()`` cannot show it: a Python
    data source shows its name and options there only. A source runner logs the same line as it starts."""
    from .streams.held import rows_path as path

    return path()


def register(spark: Any) -> None:
    """Registers ``format("amqp")`` with ``spark`` (a classic or a Spark Connect session).

    Spark finds the connector by itself when the ``pyspark_amqp`` module is importable by
    the Python it starts for its workers, once per JVM. Call this where that lookup cannot
    see the package: a notebook-scoped ``%pip`` install, an editable install, another
    ``PYSPARK_PYTHON``. Registering twice is harmless.

    It also makes ``spark`` the active session of the calling thread (classic Spark): call it
    in every thread of your own that runs ``df.write`` or ``writeStream`` with ``format("amqp")``.

    On Spark Connect it does nothing where Spark's lookup already finds this package's source:
    there a data source registered in the session made PySpark 4.3.0's Declarative Pipelines CLI
    fail runs that had completed (SPARK-59135, docs/pipelines.md).
    """
    # Imported here so that `import spark_amqp` (and its version) works without PySpark.
    from .datasource import AmqpDataSource

    if getattr(spark, "_jsparkSession", None) is None and _found_by_spark(spark):
        return
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


def _found_by_spark(spark: Any) -> bool:
    """Whether ``format("amqp")`` already resolves to this package's source in a Spark Connect session.

    The schema of a read is asked for, which Spark answers by analysing the plan, never running it: it
    looks the name up and asks the source, which builds its schema from the options alone (a uri that
    resolves nowhere, ``.invalid``, and a queue that is never declared: nothing connects). This
    source's queue schema says it is this one; not found, or another source of that name, is registered."""
    try:
        read = spark.read.format("amqp").option("uri", "amqp://spark-amqp.invalid/").option("queue", "spark_amqp.register")
        names = read.load().schema.fieldNames()
    except Exception:
        return False
    return {"body", "delivery_tag", "redelivered", "raw_header"} <= set(names)
