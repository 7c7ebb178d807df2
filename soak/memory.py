"""The soak's memory samples: the resident memory of the Spark application's processes, by role, found by their
command lines under the soak's own process (the driver's JVM is its child; source runners and Python workers are
the JVMs' children)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

ROLES = ("driver Python", "driver JVM", "source runners", "Python workers", "executor JVMs")


def _processes() -> dict[int, tuple[int, bytes]]:
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        found[int(proc.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return found


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _role(cmdline: bytes) -> str | None:
    if b"CoarseGrainedExecutorBackend" in cmdline:
        return "executor JVMs"
    if b"python_streaming_source_runner" in cmdline:
        return "source runners"
    if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline or b"pyspark.sql.worker" in cmdline:
        return "Python workers"
    if b"java" in cmdline.split(b"\0", 1)[0]:
        return "driver JVM"
    return None


def descendants(root: int) -> dict[int, bytes]:
    """The processes under ``root``, with their command lines."""
    procs = _processes()
    children = collections.defaultdict(list)
    for pid, (ppid, _) in procs.items():
        children[ppid].append(pid)
    found, stack = {}, list(children[root])
    while stack:
        pid = stack.pop()
        stack.extend(children[pid])
        found[pid] = procs[pid][1]
    return found


class Memory:
    """Samples by role (MiB, summed, and how many processes) every time ``sample`` is called, and each source runner's
    by the query it serves (``adopt``): a runner that grows shows under its query's name, not in a sum of four."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.samples: list[tuple[float, dict[str, tuple[float, int]]]] = []
        self.runner_of: dict[int, str] = {}  # a source runner's pid: the query it serves
        self.runners: list[tuple[float, dict[str, float]]] = []

    def runner_pids(self) -> set[int]:
        return {pid for pid, cmdline in descendants(self.root).items() if _role(cmdline) == "source runners"}

    def adopt(self, query: str, before: set[int], timeout: float = 60.0) -> None:
        """Names the source runner that appeared since ``before`` (the runner pids before ``query`` started) after
        ``query``: Spark starts a query's runner as the query plans its first batch, so wait for it a while."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = self.runner_pids() - before - set(self.runner_of)
            if new:
                self.runner_of[min(new)] = query
                return
            time.sleep(0.5)

    def sample(self, elapsed: float) -> str:
        sums: dict[str, tuple[float, int]] = {role: (0.0, 0) for role in ROLES}
        sums["driver Python"] = (_rss_mib(self.root), 1)
        runners: dict[str, float] = {}
        for pid, cmdline in descendants(self.root).items():
            role = _role(cmdline)
            if role:
                mib, count = sums[role]
                rss = _rss_mib(pid)
                sums[role] = (mib + rss, count + 1)
                if role == "source runners":
                    name = self.runner_of.get(pid, f"runner {pid}")
                    runners[name] = runners.get(name, 0.0) + rss
        self.samples.append((elapsed, sums))
        self.runners.append((elapsed, runners))
        return f"[{elapsed / 60:5.1f} min] RSS MiB: " + ", ".join(f"{r} {m:.0f} ({n})" for r, (m, n) in sums.items())

    def runner_table(self) -> list[str]:
        """Each query's source runner, MiB by minute (a runner started again shows under the same query)."""
        names = sorted({name for _, runners in self.runners for name in runners})
        rows = ["| min | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for elapsed, runners in self.runners:
            rows.append(f"| {elapsed / 60:.0f} | " + " | ".join(f"{runners[n]:.0f}" if n in runners else "" for n in names) + " |")
        return rows

    def table(self) -> list[str]:
        rows = ["| min | " + " | ".join(f"{r} (MiB, processes)" for r in ROLES) + " |", "| --- |" + " --- |" * len(ROLES)]
        for elapsed, sums in self.samples:
            rows.append(f"| {elapsed / 60:.0f} | " + " | ".join(f"{sums[r][0]:.0f} ({sums[r][1]})" for r in ROLES) + " |")
        return rows

    def growth(self) -> dict[str, float]:
        """Per role, and per query's source runner, the mean of the last quarter of the samples over that of the
        second quarter (the first is warm-up): near 1 is flat."""
        series = {role: [sums[role][0] for _, sums in self.samples] for role in ROLES}
        for name in sorted({name for _, runners in self.runners for name in runners if not name.startswith("runner ")}):
            series[f"{name}'s runner"] = [runners.get(name, 0.0) for _, runners in self.runners]
        return {name: ratio for name, values in series.items() if (ratio := _growth(values)) is not None}


def _growth(values: list[float]) -> float | None:
    n = len(values)
    if n < 8:
        return None
    second, last = values[n // 4 : n // 2], values[3 * n // 4 :]
    before = sum(second) / len(second)
    return sum(last) / len(last) / before if before else 0.0
