"""The session's Python workers import pyspark from the installed package, compiled once, not from
Spark's zip (changelake/spark/worker_python.py)."""

from __future__ import annotations

import os

import pyspark
import pytest

from changelake.spark import worker_python

pytestmark = pytest.mark.spark


def _where_pyspark_comes_from(batches):
    import sys

    import pyarrow as pa

    import pyspark as worker_pyspark

    for _ in batches:
        yield pa.RecordBatch.from_pydict({
            "pyspark": [worker_pyspark.__file__],
            "zips": [";".join(p for p in sys.path if p.endswith(("pyspark.zip", "-src.zip")))]})


def test_workers_import_the_installed_pyspark(spark):
    installed = os.path.dirname(pyspark.__file__)
    if not os.path.isfile(os.path.join(installed, "python", "lib", "pyspark.zip")):
        pytest.skip(f"pyspark at {installed} is not pip's layout (no python/lib/pyspark.zip inside the package)")
    rows = (spark.range(4, numPartitions=2).mapInArrow(_where_pyspark_comes_from, "pyspark string, zips string")
            .distinct().collect())
    assert {os.path.realpath(r.pyspark) for r in rows} == {os.path.realpath(pyspark.__file__)}
    assert {r.zips for r in rows} == {""}
    script = worker_python.script_path()
    if script is not None and os.environ.get("PYSPARK_PYTHON") == script:
        assert spark.sparkContext.pythonExec == script
    # and they compute: a Python UDF's answer comes back
    assert sorted(spark.range(3).mapInArrow(lambda it: it, "id long").toPandas()["id"]) == [0, 1, 2]


def _ancestors(batches):
    import os

    import pyarrow as pa

    def cmdline(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    chain, pid = [], os.getpid()
    for _ in range(4):                      # worker <- daemon <- server (or the JVM)
        pid = parent(pid)
        chain.append(cmdline(pid))
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"chain": [" | ".join(chain)]})


def test_workers_are_forks_of_the_fork_server(spark):
    """On a local master the session's Python workers are forked by the fork server (changelake/spark/fork_server.py),
    not started by the JVM as new interpreters, and they compute as before."""
    from changelake.spark import fork_server

    if os.environ.get(fork_server.ENV, "").lower() in ("", "off", "false", "0", "none"):
        pytest.skip(f"the fork server is off in this session ({fork_server.ENV}={os.environ.get(fork_server.ENV)!r})")
    rows = spark.range(4, numPartitions=2).mapInArrow(_ancestors, "chain string").collect()
    assert rows and all("changelake.spark.fork_server" in r.chain for r in rows), [r.chain for r in rows]
    assert sorted(spark.range(3).mapInArrow(lambda it: it, "id long").toPandas()["id"]) == [0, 1, 2]
