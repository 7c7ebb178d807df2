"""A local SparkSession with Delta Lake, for the examples and the test suite.

    from sparkenv import local_spark
    spark = local_spark("my-job")

Delta's jars come from a folder filled by ``make jars`` (Maven, see
conf/delta/pom.xml), ``<repo>/.cache/jars`` unless ``SPARK_AMQP_JARS`` names
another one; Spark's own resolver (``spark.jars.packages``) is not used.
Importing this module has no side effects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JARS_ENV = "SPARK_AMQP_JARS"
# The Spark line conf/delta/pom.xml fetches Delta for (delta-spark_4.2_2.13). Sessions on
# other PySpark lines (the test matrix) run without Delta.
DELTA_SPARK_LINE = "4.2"
DEFAULT_JARS_DIR = Path(__file__).resolve().parent.parent / ".cache" / "jars"

DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
# Local sessions listen on loopback only: where the hostname resolves to 127.0.0.1, Spark would
# otherwise bind its driver to the machine's external interface (and warn that it does).
LOOPBACK_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
LOCAL_CONF = {
    **LOOPBACK_CONF,
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # Delta rebuilds a table's state from its log in 50 tasks by default; on one
    # machine with small tables that is most of the time of every read or write.
    "spark.databricks.delta.snapshotPartitions": "2",
}


class DeltaJarsMissing(RuntimeError):
    """The folder with Delta's jars is missing or holds no delta-spark jar."""


def jars_dir() -> Path:
    """The folder with Delta's jars: ``$SPARK_AMQP_JARS`` or ``<repo>/.cache/jars``."""
    configured = os.environ.get(JARS_ENV)
    return Path(configured).expanduser().resolve() if configured else DEFAULT_JARS_DIR


def delta_jars() -> list[str]:
    """Absolute paths of every jar in ``jars_dir()``; raises DeltaJarsMissing if there is no delta-spark jar."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar")) if folder.is_dir() else []
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        where = f"{JARS_ENV}={folder}" if os.environ.get(JARS_ENV) else str(folder)
        raise DeltaJarsMissing(
            f"Delta Lake jars not found in {where}: run `make jars` in the repository "
            f"(needs Maven), or point {JARS_ENV} at a folder with delta-spark and its dependencies"
        )
    return jars


def has_delta_jars_for(pyspark_version: str) -> bool:
    """Whether the jars ``make jars`` fetches are for this PySpark's line (e.g. ``"4.2.0"``)."""
    return pyspark_version.startswith(DELTA_SPARK_LINE + ".")


def delta_conf() -> dict[str, str]:
    """Spark settings for Delta and local runs: jars, SQL extension, catalog, loopback, no UI, UTC, few snapshot tasks."""
    return {"spark.jars": ",".join(delta_jars()), **DELTA_SQL_CONF, **LOCAL_CONF}


def local_spark(app_name: str, master: str = "local[2]", **extra_conf: object) -> SparkSession:
    """A local SparkSession (or the running one) with Delta.

    Spark keys have dots, so pass extra settings as a dict:
    ``local_spark("job", **{"spark.sql.shuffle.partitions": 4})``; they win over
    ``delta_conf()``.

    Python workers run this interpreter (it has pyarrow and spark_amqp) unless
    PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON are set already; Spark runs on loopback
    (``SPARK_LOCAL_IP`` unless set already, and ``LOOPBACK_CONF``).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**delta_conf(), **extra_conf}.items():
        builder = builder.config(key, str(value))
    return builder.getOrCreate()
