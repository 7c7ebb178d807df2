"""Spark's admission-control types for Python sources, which exist only from PySpark 4.2.

On 4.0/4.1 they are ``None`` and ``latestOffset`` is called without a limit: the
readers then apply their options themselves (``limit_terms(None)``).
"""

from __future__ import annotations

from typing import Any

from .trigger import TriggerOptions

__all__ = ["AVAILABLE_NOW_BASES", "default_limit", "limit_terms"]

try:  # PySpark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    AVAILABLE_NOW_BASES: tuple[type, ...] = (SupportsTriggerAvailableNow,)
except ImportError:  # PySpark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]
    AVAILABLE_NOW_BASES = ()

EVERYTHING = 2**62


def default_limit(trigger: TriggerOptions) -> Any:
    """What ``getDefaultReadLimit`` returns: the minimum if there is one (Spark's ``ReadMinRows``;
    the maximum and the delay are applied by the reader), else the maximum, else everything."""
    if ReadMaxRows is None:
        return None
    if trigger.min_messages is not None:
        return ReadMinRows(trigger.min_messages)
    if trigger.max_messages is not None:
        return ReadMaxRows(trigger.max_messages)
    return ReadAllAvailable()


def limit_terms(limit: Any) -> tuple[int | None, bool]:
    """(the most rows to take, or None for the option's maximum; whether a minimum may hold the batch back)."""
    if limit is None or ReadMaxRows is None:
        return None, True
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows), True
    if isinstance(limit, ReadAllAvailable):
        return EVERYTHING, False
    return None, True
