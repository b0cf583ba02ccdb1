"""The Python workers' daemon: pyspark's own, importing pyspark from the installed package.

Spark puts ``SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on every Python
worker's ``PYTHONPATH``. Python cannot cache the compiled modules of a zip, so every daemon Spark
starts (one per kind of worker: UDFs, the Python data source's steps) compiles pyspark's modules
from source again: 0.6-0.9 s of CPU per process on this machine. With pip's layout
(``SPARK_HOME`` = the installed ``pyspark`` package) the zip holds the same modules as the package
beside it, which Python caches as ``.pyc``; this daemon takes those zips off ``sys.path`` before it
imports pyspark, then runs ``pyspark.daemon`` as Spark would. The forked workers inherit the path.
Any other layout (a Spark distribution's own ``SPARK_HOME``) is left as it is.

It runs as ``spark.python.daemon.module`` (``changelake.spark.session`` sets it) and must not
import pyspark or anything of changelake that does before the path is set.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

_PY4J_ZIP = re.compile(r"py4j-(?P<version>[0-9][0-9A-Za-z.]*)-src\.zip$")


def redundant_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are Spark's zips of an installed pyspark (and its py4j)."""
    out = []
    for entry in path:
        lib = os.path.dirname(entry)
        if os.path.basename(lib) != "lib" or os.path.basename(os.path.dirname(lib)) != "python":
            continue
        package = os.path.dirname(os.path.dirname(lib))
        if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
            continue            # a Spark distribution's SPARK_HOME: its zips are the only copy
        name = os.path.basename(entry)
        if name == "pyspark.zip":
            out.append(entry)
        elif (m := _PY4J_ZIP.match(name)) and _installed_version("py4j") == m.group("version"):
            out.append(entry)
    return out


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    drop = set(redundant_zips(sys.path))
    sys.path[:] = [p for p in sys.path if p not in drop]
    import runpy

    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
