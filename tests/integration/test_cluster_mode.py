"""The chart's driver entry point under spark-submit: the launcher's master takes effect.

``spark-submit --master local-cluster[2,1,1024] docker/spark_driver.py run --available-now -c ...``
runs the demo pipeline (three mirrors and a join -> group -> top-N graph) from the embedded broker on
a standalone cluster of two executor JVMs started by Spark itself (SPARK_HOME = the pyspark package).
The pipeline YAML names no master, so nothing but spark-submit decides where it runs. Both executors
must have run tasks, and every table must equal a run of the same data on ``local[2]`` (and the
simulated database). The events/s of both runs are printed (docs/operations.md, "Scaling out").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.service.config import load_config
from changelake.service.demo import demo_config, expected_views, verify, verify_views

from .helpers import write_history

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "docker" / "spark_driver.py"
TABLES = ["customers", "products", "orders", "sales_by_category", "top_categories"]


def _spark_submit(master: str, config: Path) -> subprocess.CompletedProcess:
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    env = dict(os.environ, SPARK_HOME=spark_home, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "SPARK_DRIVER_MEMORY", "CHANGELAKE_FAULT"):
        env.pop(var, None)
    cmd = ["nice", "-n", "10", os.path.join(spark_home, "bin", "spark-submit"), "--master", master,
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
           str(DRIVER), "run", "--available-now", "-c", str(config)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _config(servers: str, workdir: Path, prefix: str) -> Path:
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"cluster-{prefix}",
                      max_records_per_batch=700)
    for s in raw["sources"]:
        s["topics"] = [t.replace("dbserver1", prefix, 1) for t in s["topics"]]
    assert "master" not in raw["pipeline"]          # spark-submit alone decides
    workdir.mkdir(parents=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _table(config, name: str) -> set[tuple]:
    t = read_delta(config.table_path(name))
    columns = sorted(c for c in t.column_names if not c.startswith("_"))
    return {tuple(r[c] for c in columns) for r in t.select(columns).to_pylist()}


def _first_error(stderr: str) -> str:
    """The first error line and what follows (Spark's stack traces bury it)."""
    lines = stderr.splitlines()
    at = next((i for i, line in enumerate(lines) if "Error" in line or "Exception" in line), max(0, len(lines) - 40))
    return "\n".join(lines[at:at + 40])


def _rate(stdout: str) -> tuple[int, float]:
    m = re.search(r"stopped after ([\d,]+) records in ([\d.]+) s", stdout)
    assert m, stdout
    return int(m.group(1).replace(",", "")), float(m.group(2))


def test_spark_submit_master_runs_the_pipeline_on_two_executors(kafka, tmp_path):
    prefix = kafka.topic("cluster")
    db = write_history(kafka.bootstrap_servers, seed=31, changes=1_500, topic_prefix=prefix,
                       sizes={"customers": 40, "products": 60, "orders": 100})

    runs = {}
    for master in ("local[2]", "local-cluster[2,1,1024]"):
        path = _config(kafka.bootstrap_servers, tmp_path / re.sub(r"\W", "_", master), prefix)
        done = _spark_submit(master, path)
        (path.parent / "stdout.txt").write_text(done.stdout)
        (path.parent / "stderr.txt").write_text(done.stderr)
        assert done.returncode == 0, _first_error(done.stderr)
        runs[master] = (load_config(path), done)

    local_cfg, local = runs["local[2]"]
    cluster_cfg, cluster = runs["local-cluster[2,1,1024]"]
    # spark-submit's Python runner sends the driver's stderr (the log) to its stdout
    assert "ran on" not in local.stdout + local.stderr   # local mode: the driver ran every task
    log = cluster.stdout + cluster.stderr
    m = re.search(r"ran on (\d+) executor\(s\): (.*)", log)
    assert m, "\n".join(line for line in log.splitlines() if "changelake" in line)[-4000:]
    tasks = {e: int(n) for e, n in re.findall(r"executor (\S+): (\d+) task", m.group(2))}
    assert int(m.group(1)) == 2 and len(tasks) == 2, m.group(0)
    assert all(n > 0 for n in tasks.values()), f"an executor ran no task: {tasks}"

    views = expected_views(db.state)
    for cfg in (local_cfg, cluster_cfg):
        assert verify(cfg, db.state) == {t: "ok" for t in db.state}
        assert verify_views(cfg, views) == {t: "ok" for t in views}
    for name in TABLES:
        assert _table(cluster_cfg, name) == _table(local_cfg, name), name

    (n_local, s_local), (n_cluster, s_cluster) = _rate(local.stdout), _rate(cluster.stdout)
    assert n_local == n_cluster > 0
    print(f"\n{n_local} records: local[2] {s_local:.1f} s ({n_local / s_local:,.0f} events/s), "
          f"local-cluster[2,1,1024] {s_cluster:.1f} s ({n_cluster / s_cluster:,.0f} events/s); tasks {tasks}")
