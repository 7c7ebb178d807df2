"""Print each failed or errored test of the lanes' JUnit files in a few lines: its id and the end of its message.

.ci/run prints this last, whatever failed: a CI run's record keeps only the end of its output, where a lane's own
report (Spark's stack traces, the faults lane's captured output) would otherwise leave no room for which test failed
and why.

    python3 tools/failures.py .cache/junit-*.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

WIDTH = 600  # characters kept of each failure's message: the assertion and the value it printed


def failures(path: Path) -> list[str]:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:  # a lane killed mid-write leaves a partial file: say so, not a traceback
        return [f"{path.name}: unreadable ({e})"]
    found = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            for item in case.findall(kind):
                # The report's "E" lines hold the whole assertion; the message attribute only its first line.
                told = [line[1:] for line in (item.text or "").splitlines() if line.startswith("E ")]
                message = " ".join(" ".join(told or [item.get("message") or ""]).split())
                if len(message) > WIDTH:
                    message = message[: WIDTH // 2] + " … " + message[-WIDTH // 2 :]
                found.append(f"{path.stem.removeprefix('junit-')}: {kind} {case.get('classname')}::{case.get('name')}\n    {message}")
    return found


def main(paths: list[str]) -> int:
    lines = [line for p in sorted(paths) if Path(p).is_file() for line in failures(Path(p))]
    if lines:
        print("::: failed tests (from the lanes' JUnit files)")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
