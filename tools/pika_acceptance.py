"""Run pika's own acceptance suite against a real RabbitMQ and against the embedded broker.

Not part of CI: it needs a checkout of pika (its ``tests/acceptance`` talk to a broker on
127.0.0.1:5672, hard-coded) and takes a few minutes. The suite's files are extracted from
a git directory of pika/pika, and for the embedded broker the copy's port 5672 is rewritten
to the port the embedded broker listens on, so both runs execute the same tests.

    python tools/pika_acceptance.py --pika-git-dir /path/to/pika/.git
    python tools/pika_acceptance.py --pika-git-dir ... --only embedded -k "Tx or Flow"

The pika package is taken from the same checkout, so tests and library match. Prints pass,
fail, error and skip counts for each broker, and the names of the tests that did not pass.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def extract(git_dir: str, dest: Path) -> None:
    """``git archive`` of pika's library, tests and project file into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "--git-dir", git_dir, "archive", "HEAD", "pika", "tests", "pyproject.toml"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    # pika's tests/ is a namespace package; a regular package named tests elsewhere on
    # the path (this project's own, through its editable install) would shadow it.
    (dest / "tests" / "__init__.py").touch()


def retarget(tree: Path, port: int) -> None:
    """Point the suite's hard-coded broker port at ``port``."""
    for path in (tree / "tests").rglob("*.py"):
        text = path.read_text()
        new = re.sub(r"\b5672\b", str(port), text)
        if new != text:
            path.write_text(new)


def run_suite(tree: Path, label: str, extra: list[str], timeout: float) -> dict[str, object]:
    report = tree / f"junit-{label}.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        f"--junitxml={report}",
        "tests/acceptance",
        *extra,
    ]
    try:
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=timeout, env=_env(tree))
        tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout else []
    except subprocess.TimeoutExpired:
        tail = [f"timed out after {timeout:.0f} s"]
    return {"label": label, **_counts(report), "summary": tail}


def _env(tree: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)  # pika from the same checkout as its tests
    return env


def _counts(report: Path) -> dict[str, object]:
    if not report.exists():
        return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": ["(no junit report)"]}
    passed = failed = errors = skipped = 0
    not_passed: list[str] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            failed += 1
            not_passed.append(f"FAIL  {name}: {_reason(case, 'failure')}")
        elif "error" in kinds:
            errors += 1
            not_passed.append(f"ERROR {name}: {_reason(case, 'error')}")
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return {"passed": passed, "failed": failed, "errors": errors, "skipped": skipped, "not_passed": not_passed}


def _reason(case: ET.Element, tag: str) -> str:
    """The last line of the failure's message: the exception, not the traceback's start."""
    node = case.find(tag)
    text = ((node.get("message") or "") + "\n" + (node.text or "")) if node is not None else ""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(("File ", "^"))]
    found = [line for line in lines if "Error" in line or "assert" in line]
    return (found or lines or [""])[-1][:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pika-git-dir", required=True, help="git directory of a pika/pika clone (e.g. .../pika/.git)")
    parser.add_argument("--workdir", help="where to extract the suite (default: a temporary directory, removed afterwards)")
    parser.add_argument("--only", choices=("rabbitmq", "embedded"), help="run against one broker only")
    parser.add_argument("--rabbitmq-port", type=int, default=5672, help="the real RabbitMQ's port (guest/guest on 127.0.0.1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per suite run")
    parser.add_argument("--show", type=int, default=60, help="how many not-passed tests to list per broker")
    args, pytest_extra = parser.parse_known_args(argv)

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="pika-acceptance-"))
    source = work / "src"
    if not source.exists():
        extract(args.pika_git_dir, source)
    results = []
    try:
        if args.only in (None, "rabbitmq"):
            tree = work / "rabbitmq"
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(source, tree)
            if args.rabbitmq_port != 5672:
                retarget(tree, args.rabbitmq_port)
            results.append(run_suite(tree, "rabbitmq", pytest_extra, args.timeout))
        if args.only in (None, "embedded"):
            from spark_amqp_broker import EmbeddedBroker

            with EmbeddedBroker(heartbeat=60) as broker:
                tree = work / "embedded"
                shutil.rmtree(tree, ignore_errors=True)
                shutil.copytree(source, tree)
                retarget(tree, broker.port)
                results.append(run_suite(tree, "embedded", pytest_extra, args.timeout))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for result in results:
        missing = sum("ModuleNotFoundError" in line for line in result["not_passed"])  # type: ignore[attr-defined]
        print(
            f"{result['label']:>9}: {result['passed']} passed, {result['failed']} failed, "
            f"{result['errors']} errors, {result['skipped']} skipped; {missing} of those not passed only lack an "
            f"adapter's module (gevent, tornado, twisted)   ({' '.join(result['summary'])})"  # type: ignore[arg-type]
        )
    for result in results:
        shown = result["not_passed"][: args.show]  # type: ignore[index]
        if shown:
            print(f"\n-- not passed on {result['label']} --")
            print("\n".join(shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
