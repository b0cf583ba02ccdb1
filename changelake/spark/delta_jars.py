"""Where the delta-spark jars are looked for, and their version; imports no pyspark (``--version`` reads it).

===========================================  =========================================================
where                                         how they reach Spark
===========================================  =========================================================
the project's ``delta`` JVM set              installed by ``make install`` (``python -m
(``.jvm/delta/``, changelake/jvm_deps.py)     changelake.jvm_deps install delta``); the session builder
                                              puts them in ``spark.jars`` (:func:`session_jars`)
pyspark's own ``jars`` directory or           already on Spark's classpath (the Docker image puts them
``$SPARK_HOME/jars``                          there; docs/sink.md, "Engines"): nothing to add
===========================================  =========================================================
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

from changelake import jvm_deps

#: the JVM set of changelake/jvm_deps.py that holds delta-spark and delta-storage
DELTA_SET = "delta"
_DELTA_JAR_GLOB = "delta-spark_*.jar"
#: delta-spark_<spark>_<scala>-<version>.jar (4.x) or delta-spark_<scala>-<version>.jar
_VERSION = re.compile(r"delta-spark_[\d._]+-(.+)\.jar$")


def jar_dirs() -> list[str]:
    """pyspark's ``jars`` directory (found without importing pyspark) and ``$SPARK_HOME/jars``."""
    out = []
    spec = importlib.util.find_spec("pyspark")
    for location in (spec.submodule_search_locations or []) if spec else []:
        out.append(os.path.join(location, "jars"))
    if os.environ.get("SPARK_HOME"):
        out.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    return out


def spark_home_jars() -> list[str]:
    """The delta-spark jars already in Spark's own jar directories."""
    return sorted(p for d in jar_dirs() for p in glob.glob(os.path.join(d, _DELTA_JAR_GLOB)))


def session_jars() -> list[str]:
    """The jars a session builder must add for delta-spark: the ``delta`` set's, or none when Spark's
    own directories hold delta-spark already or the set is not installed (see :func:`missing`)."""
    if spark_home_jars() or jvm_deps.missing(DELTA_SET):
        return []
    return [str(p) for p in jvm_deps.jars(DELTA_SET)]


def missing() -> str | None:
    """Why no delta-spark jars are available to a new session (says how to install them), or None."""
    if spark_home_jars():
        return None
    return jvm_deps.missing(DELTA_SET)


def delta_spark_jars() -> list[str]:
    """Every delta-spark jar a new session would load (Spark's directories first, then the ``delta`` set)."""
    found = spark_home_jars()
    if not found and not jvm_deps.missing(DELTA_SET):
        found = sorted(str(p) for p in jvm_deps.set_dir(DELTA_SET).glob(_DELTA_JAR_GLOB))
    return found


def delta_spark_version() -> str | None:
    """The version of the delta-spark jar Spark would load, or None when there is none."""
    for path in delta_spark_jars():
        m = _VERSION.search(os.path.basename(path))
        if m:
            return m.group(1)
    return None
