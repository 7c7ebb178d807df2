"""Reading a queue to its end on every PySpark line the tests run on.

On PySpark 4.2+ a Python source supports ``Trigger.AvailableNow``: the run reads what the
queues held when it started, in batches, and stops. On 4.0 and 4.1 Spark wraps the source
instead: it asks once for the latest offset, runs that one batch and stops, and never
tells the source the batch was committed, so its messages are never acknowledged and come
back in the next run. There, a query with the default trigger is stopped once the test's
condition holds (docs/pyspark-versions.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyspark

from ..broker.helpers import wait_for

PYSPARK_LINE = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
AVAILABLE_NOW_DRAINS = PYSPARK_LINE >= (4, 2)


def run_to_the_end(writer: Any, done: Callable[[], object], timeout: float = 180) -> None:
    """Runs ``writer`` (a ``DataStreamWriter``) until ``done()`` holds; the query is stopped after."""
    if AVAILABLE_NOW_DRAINS:
        query = writer.trigger(availableNow=True).start()
        assert query.awaitTermination(timeout), "the AvailableNow run did not finish"
        assert query.exception() is None, query.exception()
        assert wait_for(done, timeout=30)
        return
    query = writer.start()
    try:
        wait_for(lambda: not query.isActive or done(), timeout=timeout, interval=0.2)
        assert query.exception() is None, query.exception()
        assert query.isActive, "the query stopped by itself"
    finally:
        query.stop()
