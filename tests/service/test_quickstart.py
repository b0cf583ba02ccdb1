"""docs/quickstart.md's snippets run against the demo's tables: the Python (deltalake) one as written,
in a fresh interpreter from the directory ``make demo`` runs in; the Spark SQL one's queries on the
test session."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import changelake.service.inventory as inv
from changelake.service.demo import demo_config, write_demo_config
from changelake.service.pipeline import BatchProcessor
from changelake.spark.kafka_source import ARROW_SCHEMA

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", QUICKSTART.read_text(), re.S)


def _demo_tables(root: Path) -> Path:
    """``root``/demo-output as ``make demo`` leaves it: the three mirrors written by the pipeline's decode
    stage and processor in-process (no Spark), and a ``top_categories`` table of the demo's shape."""
    workdir = root / "demo-output"
    workdir.mkdir()
    raw = demo_config(bootstrap_servers="127.0.0.1:9", workdir=workdir, metrics_port=0, views=False)
    config = write_demo_config(raw, workdir / "pipeline.yaml")
    messages = [m for m in inv.InventoryDatabase(seed=5).history(
        snapshot_sizes={"customers": 20, "products": 10, "orders": 60}, changes=100, redeliver=0) if m.value is not None]
    n = len(messages)
    records = pa.RecordBatch.from_pydict({
        "topic": [m.topic for m in messages], "partition": [0] * n, "offset": list(range(n)), "timestamp": [0] * n,
        "key": [m.key for m in messages], "value": [m.value for m in messages], "expired": [0] * n},
        schema=ARROW_SCHEMA)
    processor = BatchProcessor(config, graph=None)
    processor.stage.begin({})
    processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([records])))), 0)
    write_deltalake(str(workdir / "lake" / "top_categories"), pa.table({
        "category": ["books", "toys", "garden"], "orders": pa.array([7, 5, 2], pa.int64()),
        "units": pa.array([21, 15, 4], pa.int64()), "rank": pa.array([1, 2, 3], pa.int64())}))
    return workdir / "lake"


@pytest.mark.unit
def test_the_python_snippet_runs_as_written(tmp_path):
    _demo_tables(tmp_path)
    snippet = _python_blocks()[0]
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the schema in declared order, the join per customer, the top categories
    assert "['id', 'first_name', 'last_name', 'email', '_seq', '_source_ts']" in out, out
    assert "units" in out and "last_name" in out
    assert out.index("books") < out.index("toys") < out.index("garden")


@pytest.mark.spark
def test_the_spark_sql_queries_run(spark, tmp_path):
    from changelake.spark import delta_jars
    from changelake.spark.delta_sink import delta_spark_missing
    from tests.jars import unavailable

    missing = delta_spark_missing(spark)
    if missing and delta_jars.missing():
        unavailable(f"Spark SQL on Delta tables (delta.`path`): {delta_jars.missing()}")
    # the jars are installed, so the test session (changelake/spark/session.py) has Delta's extension
    assert missing is None, f"{missing} in the tests' Spark session, although the `delta` JVM set is installed"
    lake = _demo_tables(tmp_path)
    snippet = _python_blocks()[1]
    queries = re.findall(r'spark\.sql\(f"""(.*?)"""\)|spark\.sql\(f"(.*?)"\)', snippet, re.S)
    assert len(queries) == 3
    results = [spark.sql(q.replace("{LAKE}", str(lake))).collect() for pair in queries for q in pair if q]
    top, per_category, history = results
    assert [r["category"] for r in top] == ["books", "toys", "garden"]
    assert sum(r["orders"] for r in per_category) > 0
    assert [r["operation"] for r in history][-1] == "CREATE TABLE"


@pytest.mark.unit
def test_the_spark_snippets_take_the_pinned_jars_and_download_nothing(tmp_path):
    import yaml

    from changelake import jvm_deps
    from changelake.service.config import parse_config
    from changelake.service.demo import next_steps

    config = parse_config(yaml.safe_dump(demo_config(bootstrap_servers="127.0.0.1:9", workdir=tmp_path,
                                                     metrics_port=0)))
    for text in (_python_blocks()[1], next_steps(config, tmp_path, "127.0.0.1:9")):
        # configure_spark_with_delta_pip has Spark fetch Delta's jars through Ivy at the session's start
        assert "configure_spark_with_delta_pip" not in text and "spark.jars.packages" not in text
        assert 'config("spark.jars", ",".join(delta_jars.session_jars()))' in text
        assert "delta_jars.missing()" in text
    assert "python -m changelake.jvm_deps install delta" in QUICKSTART.read_text()
    assert "delta" in jvm_deps.SETS
