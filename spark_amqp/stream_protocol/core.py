"""The compiled core (spark-amqp-core, Rust) or the pure-Python path for stream chunks: picked once, at import.

As msgpack picks ``_cmsgpack`` or ``fallback``: the core turns a whole chunk into Arrow column buffers in one call;
the pure-Python twin (``chunks.records``, ``rows.RowMaker``, ``reading.arrow.to_stream_batch``) stays the reference.
Python runs wherever the core is not installed (spark-amqp requires it on Linux x86_64 and aarch64 under CPython
only), for every chunk the core leaves to it (``Builder.add`` returns None: compressed sub-entries, RabbitMQ 3.x's
conversion, nested or odd values, anything malformed, so that a bad message fails the same way on both paths), and
everywhere with ``SPARK_AMQP_PURE_PYTHON=1``. Both give identical Arrow data (tests/stream_protocol/test_core_*.py).
The same choice decides who makes AMQP 0-9-1 deliveries' property columns (``reading.core_properties``).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable
from typing import Any

from .rows import Conversion

__all__ = ["ABI", "CORE", "MISSING", "PATH", "PURE_PYTHON", "builder"]

# What this module expects of spark_amqp_core.Builder (core/src/python.rs says the same): another core is not used.
# 2: Builder takes the columns to make, and finish gives None for the others. 3: basic_properties (AMQP 0-9-1 content
# headers to the property columns, reading.core_properties). 4: amqp10_records (the sinks' rows to AMQP 1.0 messages,
# sink.core_records).
ABI = 4
# Set to 1 (any value but empty or 0) to run the pure-Python path where the core is installed.
PURE_PYTHON = "SPARK_AMQP_PURE_PYTHON"


def _load() -> tuple[Any, str]:
    """The core's module (None for the pure-Python path), and which path runs, in words."""
    if os.environ.get(PURE_PYTHON, "") not in ("", "0"):
        return None, f"pure Python ({PURE_PYTHON}={os.environ[PURE_PYTHON]})"
    try:
        import spark_amqp_core  # type: ignore[import-not-found,unused-ignore]
    except ImportError as err:
        return None, f"pure Python (no compiled core here: {err})"
    version = getattr(spark_amqp_core, "__version__", "?")
    abi = getattr(spark_amqp_core, "ABI", None)
    if abi != ABI:
        return None, f"pure Python (spark-amqp-core {version} speaks ABI {abi}, this connector ABI {ABI}: install the same versions)"
    return spark_amqp_core, f"compiled core (spark-amqp-core {version}, Rust)"


# Tests flip CORE to None to run the pure-Python path in-process (tests/streams/conftest.py).
CORE, PATH = _load()
# Where spark-amqp requires the core (its dependency's environment marker), and it is not used all the same though
# nobody asked for the pure-Python path: worth a warning (an install that left it out, or two versions that differ).
MISSING = (
    CORE is None
    and PURE_PYTHON not in os.environ
    and sys.platform == "linux"
    and sys.implementation.name == "cpython"
    and platform.machine() in ("x86_64", "aarch64")
)


def builder(
    stream: str, conversion: Conversion, filter_values: Iterable[str] | None, match_unfiltered: bool, columns: Iterable[str] | None = None
) -> Any:
    """A core ``Builder`` for one stream's chunks, or None where the pure-Python path makes every row (no core, or
    RabbitMQ 3.x's conversion, which only Python has). ``columns``: those to make (None: all), as ``RowMaker``'s."""
    if CORE is None or conversion.legacy:
        return None
    values = None if filter_values is None else sorted(filter_values)
    made = None if columns is None else [c for c in columns if c != "raw_header"]  # always null here: Python's to make
    return CORE.Builder(stream, conversion.headerless_durable, conversion.address_reply_to, values, match_unfiltered, made)
