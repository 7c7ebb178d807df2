"""What the benchmarks measure of the machine: CPU per process group from /proc (``CpuMeter``), the
process behind a port, and RabbitMQ's PerfTest (the best AMQP client there is: the broker's limit)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PERFTEST_DIR = REPO / ".cache" / "perftest"
PERFTEST_MAIN = "com.rabbitmq.perf.PerfTest"
STREAM_CLIENT_MAIN = "StreamConsume"
RUNNER = "python_streaming_source_runner"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str) -> tuple[str, int, int] | None:
    """(comm, ppid, utime+stime in ticks) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def listening_pid(port: int) -> int | None:
    """The process listening on a local TCP port (from /proc/net/tcp and the processes' sockets), None if not found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{entry}/fd")):
                return int(entry)
        except OSError:
            continue
    return None


# The measured node's beam.smp, once known: other RabbitMQ nodes on the machine count as "other brokers".
BROKER_PIDS: set[int] = set()
# Other processes a benchmark names (ActiveMQ Artemis's JVM: "artemis"), each counted as a group of its own.
NAMED_PIDS: dict[int, str] = {}


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) ticks of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuMeter:
    """CPU used while a run goes, in cores, per group of processes (sampled from /proc every 0.25 s).

    Groups: RabbitMQ (beam.smp: the measured node's, when ``BROKER_PIDS`` names it; other nodes
    on the machine are "other brokers"), ActiveMQ Artemis (when ``NAMED_PIDS`` names it), this script's process, and among its descendants
    Spark's JVM, the source runner (the planner, on the driver), Spark's Python
    workers (executor tasks), PerfTest, the Java stream client; every other process is "other jobs".
    The Python stream-protocol baselines (rstream, StreamClient) run in "bench script".
    """

    GROUPS = (
        "beam.smp",
        "artemis",
        "py workers",
        "spark JVM",
        "source runner",
        "bench script",
        "PerfTest",
        "stream client",
        "other brokers",
        "other jobs",
    )
    NOT_OURS = ("other brokers", "other jobs")

    def __init__(self) -> None:
        self._base: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._group: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.used: dict[str, float] = {}
        self.machine = 0.0
        self.seconds = 0.0
        self.loadavg = ""

    def __enter__(self) -> CpuMeter:
        self._base = dict(self._sample())
        self._last = dict(self._base)
        self._machine0 = _machine_ticks()
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(self._sample())
        self.seconds = time.monotonic() - self._start
        busy, total = _machine_ticks()
        cpus = os.cpu_count() or 1
        self.machine = cpus * (busy - self._machine0[0]) / max(1, total - self._machine0[1])
        used: dict[str, float] = dict.fromkeys(self.GROUPS, 0.0)
        for pid, ticks in self._last.items():
            used[self._group[pid]] += (ticks - self._base.get(pid, 0)) / CLOCK_TICKS
        self.used = {g: s / self.seconds for g, s in used.items()}
        with open("/proc/loadavg") as f:
            self.loadavg = " ".join(f.read().split()[:3])

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._last.update(self._sample())

    def _sample(self) -> dict[int, int]:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := _proc_stat(entry)) is not None:
                stats[int(entry)] = st
        me = os.getpid()
        ticks = {}
        for pid, (comm, _, cpu) in stats.items():
            if pid not in self._group:
                self._group[pid] = self._classify(pid, comm, stats, me)
            ticks[pid] = cpu
        return ticks

    @staticmethod
    def _classify(pid: int, comm: str, stats: dict[int, tuple[str, int, int]], me: int) -> str:
        if pid in NAMED_PIDS:
            return NAMED_PIDS[pid]
        if comm == "beam.smp":
            return "beam.smp" if not BROKER_PIDS or pid in BROKER_PIDS else "other brokers"
        if pid == me:
            return "bench script"
        parent, seen = stats[pid][1], 0
        while parent not in (0, 1, me) and parent in stats and seen < 64:
            parent, seen = stats[parent][1], seen + 1
        if parent != me:
            return "other jobs"
        cmdline = _cmdline(pid)
        if PERFTEST_MAIN.encode() in cmdline:
            return "PerfTest"
        if STREAM_CLIENT_MAIN.encode() in cmdline:
            return "stream client"
        if comm == "java":
            return "spark JVM"
        if RUNNER.encode() in cmdline:
            return "source runner"
        return "py workers"

    def per_message(self, messages: int) -> dict[str, float]:
        """The CPU µs per message of each of this run's own groups (those that used at least 0.005 cores)."""
        return {g: c * self.seconds / messages * 1e6 for g, c in self.used.items() if g not in CpuMeter.NOT_OURS and c >= 0.005}

    def summary(self, messages: int | None = None) -> str:
        """The cores each group used; with ``messages``, also the CPU per message of this run's own processes
        and the rate they would reach if they had every CPU to themselves (the bound CPU sets)."""
        parts = ", ".join(f"{g} {c:.2f}" for g, c in self.used.items() if c >= 0.005)
        text = (
            f"CPU in cores over {self.seconds:.1f} s: {parts}; machine busy {self.machine:.2f} of {os.cpu_count()}; loadavg {self.loadavg}"
        )
        if messages:
            per = self.per_message(messages)
            total = sum(per.values())
            costs = ", ".join(f"{g} {us:.1f}" for g, us in per.items())
            cpus = os.cpu_count() or 1
            text += (
                f"\n    CPU per message in us: {costs}; total {total:.1f} us = at most {cpus / total * 1e6:,.0f} msg/s on {cpus} idle CPUs"
            )
        return text


def perftest(jars: Path, url: str, *args: str, timeout: float | None = None) -> str:
    """PerfTest's output; raises if it fails."""
    cmd = ["java", "-cp", f"{jars}/*", PERFTEST_MAIN, "--uri", url, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"PerfTest failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout
