"""The compiled core and the connector are released together: one version in pyproject.toml, core/pyproject.toml,
core/Cargo.toml and the connector's requirement of the core (which the Makefile's wheel names follow)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_everywhere() -> None:
    connector = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = tomllib.loads((ROOT / "core" / "pyproject.toml").read_text())["project"]
    crate = tomllib.loads((ROOT / "core" / "Cargo.toml").read_text())["package"]
    required = [d for d in connector["dependencies"] if d.startswith("spark-amqp-core")]
    assert len(required) == 1 and re.match(r"spark-amqp-core==([^;\s]+)", required[0])
    pinned = re.match(r"spark-amqp-core==([^;\s]+)", required[0]).group(1)  # type: ignore[union-attr]
    assert connector["version"] == core["version"] == crate["version"] == pinned
    # Where the core has wheels (make wheel): Linux x86_64 and aarch64, CPython; Python everywhere else.
    assert "sys_platform == 'linux'" in required[0] and "'x86_64'" in required[0] and "'aarch64'" in required[0]
