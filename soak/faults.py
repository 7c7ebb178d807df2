"""The soak's faults, one of the five of issue 35 at a time, each through the project's own tools (``tools/netfault``,
``tools/haproxy``, ``tools/rabbitmq``) and each undone before it returns, whatever happens: a silent node, a
partition, the load balancer restarted or without a node, a node lost for good and replaced, an executor SIGKILLed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

from memory import descendants

TOOLS = Path(__file__).resolve().parent.parent / "tools"
PORTS = {"c1": (5701, 5711), "c2": (5702, 5712), "c3": (5703, 5713), "c4": (5704, 5714)}


def tool(name: str, *args: str, timeout: float = 300) -> str:
    done = subprocess.run([str(TOOLS / name), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"tools/{name} {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def executors(app_pid: int) -> list[int]:
    """The executor JVMs of the Spark application whose driver runs under ``app_pid`` (on ``local-cluster`` the
    driver's JVM starts them)."""
    return [pid for pid, cmdline in descendants(app_pid).items() if b"CoarseGrainedExecutorBackend" in cmdline]


def _dropping(seconds: float, *netfault: str) -> None:
    """``tools/netfault`` with ``netfault`` for ``seconds``, then everything let through again."""
    tool("netfault", *netfault)
    try:
        time.sleep(seconds)
    finally:
        tool("netfault", "clear")


class Faults:
    """The fault catalogue. ``members`` is the cluster as it is now: c3 and the spare c4 trade places each time a
    node is lost for good, so the other three always form the cluster the queries' uri names in part."""

    def __init__(self, rng: random.Random, streams: tuple[str, ...], app_pid: int) -> None:
        self.rng, self.streams, self.app_pid = rng, streams, app_pid
        self.members = ["c1", "c2", "c3"]
        self.bag: list[str] = []

    def pick(self) -> tuple[str, object]:
        """The next fault: each of the five once, in a random order, then again, so that even a short run sees
        every kind (a plain random choice need not)."""
        if not self.bag:
            self.bag = ["silent network", "partition", "load balancer", "node lost", "executor lost"]
            self.rng.shuffle(self.bag)
        kind = self.bag.pop()
        return kind, getattr(self, kind.replace(" ", "_"))

    def silent_network(self) -> str:
        node, seconds = self.rng.choice(self.members), self.rng.choice([20, 30, 45])
        _dropping(seconds, "drop", *(str(p) for p in PORTS[node]))
        return f"{node}'s client ports silent for {seconds} s"

    def partition(self) -> str:
        node, seconds = self.rng.choice(self.members), self.rng.choice([30, 60])
        _dropping(seconds, "isolate", tool("rabbitmq", "cgroup", node), *(str(p) for p in PORTS[node]))
        return f"{node} cut off from the others for {seconds} s"

    def load_balancer(self) -> str:
        if self.rng.random() < 0.5:
            tool("haproxy", "stop")
            try:
                time.sleep(5)
            finally:
                tool("haproxy", "start")
            return "HAProxy stopped for 5 s"
        node = self.rng.choice(["c1", "c2"])  # its backends know c1-c3, and c3 may be lost
        tool("haproxy", "disable", node)
        try:
            time.sleep(20)
        finally:
            tool("haproxy", "enable", node)
        return f"{node} out of HAProxy's backends for 20 s"

    def node_lost(self) -> str:
        lost = "c3" if "c3" in self.members else "c4"
        fresh = "c4" if lost == "c3" else "c3"
        tool("rabbitmq", "lose", lost)
        self.members[self.members.index(lost)] = fresh
        tool("rabbitmq", "start", fresh)
        tool("rabbitmq", "cli", "c1", "rabbitmq-queues", "grow", f"{fresh}@localhost", "all")
        for stream in self.streams:
            tool("rabbitmq", "cli", "c1", "rabbitmq-streams", "add_replica", stream, f"{fresh}@localhost")
        return f"{lost} lost for good, {fresh} joined and given members"

    def executor_lost(self) -> str:
        jvms = executors(self.app_pid)
        if not jvms:
            return "no executor to kill"
        victim = self.rng.choice(jvms)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return "the executor chosen had just exited"
        return f"executor JVM {victim} SIGKILLed"

    def restore(self) -> None:
        """The cluster as the tests know it: c1, c2, c3 and HAProxy, nothing dropped."""
        tool("netfault", "clear")
        tool("haproxy", "start")
        for node in ("c1", "c2"):
            tool("haproxy", "enable", node)
        if "c4" in self.members:
            tool("rabbitmq", "lose", "c4")
            tool("rabbitmq", "start", "c3")
            self.members[self.members.index("c4")] = "c3"
