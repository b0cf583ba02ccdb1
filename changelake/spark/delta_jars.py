"""Where the delta-spark jars are looked for, and their version; imports no pyspark (``--version`` reads it).

The jars count when ``delta-spark_<scala>-<version>.jar`` is in pyspark's own ``jars`` directory or in
``$SPARK_HOME/jars`` (the Docker image puts them there; docs/sink.md, "Engines").
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

_DELTA_JAR_GLOB = "delta-spark_*.jar"
_VERSION = re.compile(r"delta-spark_[\d.]+-(.+)\.jar$")


def jar_dirs() -> list[str]:
    """pyspark's ``jars`` directory (found without importing pyspark) and ``$SPARK_HOME/jars``."""
    out = []
    spec = importlib.util.find_spec("pyspark")
    for location in (spec.submodule_search_locations or []) if spec else []:
        out.append(os.path.join(location, "jars"))
    if os.environ.get("SPARK_HOME"):
        out.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    return out


def delta_spark_jars() -> list[str]:
    return sorted(p for d in jar_dirs() for p in glob.glob(os.path.join(d, _DELTA_JAR_GLOB)))


def delta_spark_version() -> str | None:
    """The version of the delta-spark jar Spark would load, or None when there is none."""
    for path in delta_spark_jars():
        m = _VERSION.search(os.path.basename(path))
        if m:
            return m.group(1)
    return None
