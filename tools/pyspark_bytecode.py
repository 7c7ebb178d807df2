"""Puts bytecode into the zips a pip-installed PySpark starts its Python processes from, in the venv that runs this.

Spark puts ``pyspark/python/lib/pyspark.zip`` (and py4j's zip) first on the PYTHONPATH of every Python process it
starts: the daemon, each data source planner, each streaming source runner. The zips hold sources only, and a zip
takes no bytecode cache, so each of those processes compiled pyspark again: 1.9 s of CPU to import what a streaming
source runner needs, against 0.9 s from the venv's own (compiled) pyspark, measured here. Spark gives a process 10 s
to connect back (not configurable), and on CI's two loaded cores that compile is what missed it. With each module's
bytecode in the zip beside its source (``x.pyc``, which zipimport prefers; unchecked-hash, so nothing compares
timestamps), the import takes the same 0.9 s. The code is the same: the bytecode is compiled from the zip's sources
by the interpreter that will run it.

    .venv/bin/python tools/pyspark_bytecode.py      (idempotent: a zip that has bytecode is left as it is)
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import warnings
import zipfile
from pathlib import Path


def with_bytecode(source: Path) -> bool:
    """Rewrites ``source`` with a ``.pyc`` beside each ``.py``; False if it had bytecode already."""
    with zipfile.ZipFile(source) as zin:
        names = zin.namelist()
        if any(n.endswith(".pyc") for n in names):
            return False
        partial = source.with_name(source.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                data = zin.read(info)
                zout.writestr(info, data)
                if info.filename.endswith(".py"):
                    with warnings.catch_warnings():  # pyspark's own tests have literals compared with `is`
                        warnings.simplefilter("ignore")
                        code = compile(data, info.filename, "exec", dont_inherit=True)
                    header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little") + importlib.util.source_hash(data)
                    zout.writestr(info.filename[:-3] + ".pyc", header + marshal.dumps(code))
    os.replace(partial, source)
    return True


def main() -> None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        sys.exit("pyspark is not installed in this interpreter's environment")
    for zipped in sorted((Path(spec.origin).parent / "python" / "lib").glob("*.zip")):
        print(f"{zipped}: {'bytecode added' if with_bytecode(zipped) else 'has bytecode already'}")


if __name__ == "__main__":
    main()
