"""A Spark Connect server for one test, started as ``sbin/start-connect-server.sh`` starts one (``spark-submit
--class …SparkConnectServer``), on 127.0.0.1 and on a port the system gives it.

``SparkSession.builder.remote("local")`` and ``spark-pipelines run`` start their server on port 15002 on every
interface, and their client then dials 15002 whatever the server took (PySpark reads the real port back only under
SPARK_TESTING): a test that did so failed with ``BindException`` while another Spark Connect server ran on the
machine. This server binds port 0 and prints the port it got, and the test's client dials that
(``sc://127.0.0.1:PORT``, ``spark-pipelines run --remote``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..loopback import not_on_loopback

SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")
_STARTED = re.compile(r"Spark Connect server started at: (\S+):(\d+)")
# Warnings and errors only, but for the line that says where the server listens: Spark's default for a spark-submit
# application is INFO, some thousand lines a run.
LOG4J2 = """rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.server.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.server.level = info
"""
LOOPBACK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.connect.grpc.binding.port": "0",
}


class ConnectServer:
    """A server JVM in a process group of its own (``kill`` ends it and its Python workers at once); its output in
    ``log``, a file of its own (a port read from an earlier server's log would be a dead one). ``conf`` is passed with
    ``--conf``; ``env`` is the server's environment (its Python workers' too)."""

    def __init__(self, log: Path, conf: dict[str, str], env: dict[str, str], cwd: Path) -> None:
        assert not log.exists(), f"{log}: each server logs to a file of its own"
        log4j2 = log.with_suffix(".log4j2.properties")
        log4j2.write_text(LOG4J2)
        args = [str(SPARK_SUBMIT), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]"]
        args += ["--driver-java-options", f"-Dlog4j2.configurationFile={log4j2.as_uri()}"]
        for key, value in {"spark.ui.enabled": "false", **conf, **LOOPBACK_CONF}.items():
            args += ["--conf", f"{key}={value}"]
        self.log = log
        self.port = 0
        with log.open("wb") as out:
            env = {**env, "SPARK_LOCAL_IP": "127.0.0.1"}
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_started(self, timeout: float) -> None:
        """Until the server listens; then every socket it and its children listen on must be on loopback."""
        deadline = time.monotonic() + timeout
        while not (found := _STARTED.search(self.output())):
            assert self.proc.poll() is None, f"the Spark Connect server exited:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"the Spark Connect server did not start in {timeout:.0f}s:\n{self.output()[-3000:]}"
            time.sleep(0.2)
        assert found.group(1) == "127.0.0.1", found.group(0)
        self.port = int(found.group(2))
        assert self.port != 0
        assert not_on_loopback(self.proc.pid) == [], f"the Spark Connect server listens beyond loopback:\n{self.output()[-3000:]}"

    def kill(self) -> None:
        """SIGKILL to the server and its Python workers: a driver that dies mid-batch."""
        if _group_alive(self.proc.pid):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)  # a SIGKILLed process ends at once

    def stop(self) -> None:
        """SIGTERM (Spark's shutdown hooks run), then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # what SIGTERM left: the JVM, or Python workers it did not wait for


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
