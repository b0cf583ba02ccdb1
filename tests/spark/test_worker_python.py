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
