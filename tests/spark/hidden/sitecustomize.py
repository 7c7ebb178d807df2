"""Put on PYTHONPATH by tests/spark/test_deployments.py: Spark's auto-registration scans
modules with ``pkgutil.iter_modules``; this makes the scan skip ``pyspark_amqp``, as it
does for a package installed in editable mode through import hooks. Imports still work."""

import pkgutil

_iter_modules = pkgutil.iter_modules


def _without_pyspark_amqp(path=None, prefix=""):  # type: ignore[no-untyped-def]
    return (m for m in _iter_modules(path, prefix) if m.name != "pyspark_amqp")


pkgutil.iter_modules = _without_pyspark_amqp
