"""The soak's memory samples: the resident memory of the Spark application's processes, by role, found by their
command lines under the soak's own process (the driver's JVM is its child; source runners and Python workers are
the JVMs' children)."""

from __future__ import annotations

import collections
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
    """Samples by role (MiB, summed, and how many processes) every time ``sample`` is called."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.samples: list[tuple[float, dict[str, tuple[float, int]]]] = []

    def sample(self, elapsed: float) -> str:
        sums: dict[str, tuple[float, int]] = {role: (0.0, 0) for role in ROLES}
        sums["driver Python"] = (_rss_mib(self.root), 1)
        for pid, cmdline in descendants(self.root).items():
            role = _role(cmdline)
            if role:
                mib, count = sums[role]
                sums[role] = (mib + _rss_mib(pid), count + 1)
        self.samples.append((elapsed, sums))
        return f"[{elapsed / 60:5.1f} min] RSS MiB: " + ", ".join(f"{r} {m:.0f} ({n})" for r, (m, n) in sums.items())

    def table(self) -> list[str]:
        rows = ["| min | " + " | ".join(f"{r} (MiB, processes)" for r in ROLES) + " |", "| --- |" + " --- |" * len(ROLES)]
        for elapsed, sums in self.samples:
            rows.append(f"| {elapsed / 60:.0f} | " + " | ".join(f"{sums[r][0]:.0f} ({sums[r][1]})" for r in ROLES) + " |")
        return rows

    def growth(self) -> dict[str, float]:
        """Per role, the mean of the last quarter of the samples over that of the second quarter (the first is
        warm-up): near 1 is flat."""
        n = len(self.samples)
        if n < 8:
            return {}
        second, last = self.samples[n // 4 : n // 2], self.samples[3 * n // 4 :]
        out = {}
        for role in ROLES:
            before = sum(s[role][0] for _, s in second) / len(second)
            after = sum(s[role][0] for _, s in last) / len(last)
            out[role] = after / before if before else 0.0
        return out
