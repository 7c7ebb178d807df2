"""The tests' Spark listens on loopback only (docs/development.md, "Loopback and free ports").

The shared session is checked here, on every PySpark line; the Spark Connect servers the tests start check
themselves as they start (``connect_server.py``), and the jobs the tests run as subprocesses inherit
``SPARK_LOCAL_IP`` and build their sessions with ``sparkenv.local_spark``, both checked below.
"""

from __future__ import annotations

import os

import pytest
import sparkenv

from ..loopback import listening, not_on_loopback

pytestmark = pytest.mark.spark


def test_the_shared_session_listens_on_loopback_only(spark) -> None:  # type: ignore[no-untyped-def]
    spark.range(4).selectExpr("id + 1").collect()  # a job: the block manager and the executor's ports in use
    conf = spark.sparkContext.getConf()
    assert (conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress")) == ("127.0.0.1", "127.0.0.1")
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    assert listening(jvm), "no listening socket found: the check would pass whatever Spark did"
    assert not_on_loopback(jvm) == []


def test_what_the_tests_subprocesses_inherit_keeps_them_on_loopback() -> None:
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"  # tests/conftest.py: spark-submit, spark-pipelines, the jobs
    assert sparkenv.LOOPBACK_CONF.items() <= sparkenv.LOCAL_CONF.items()
