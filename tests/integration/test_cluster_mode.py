"""The chart's driver entry point under spark-submit: the launcher's master takes effect.

Runs ``bench/scaleout.py --quick``: ``spark-submit --master M docker/spark_driver.py run --available-now``
on the demo pipeline (three mirrors and a join -> group -> top-N graph) from the test broker, for
``local[2]`` and for ``local-cluster[2,1,1024]`` (a standalone cluster of two executor JVMs started by
Spark itself; SPARK_HOME = the pyspark package), same data, one after the other. The pipeline YAML
names no master, so nothing but spark-submit decides where it runs. The script exits non-zero unless
both executors ran tasks (and the local run none), every table equals the simulated database and the
other run, and both read the same records; it prints the events/s of both runs (docs/operations.md,
"Scaling out").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from changelake.spark import worker_python

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_master_runs_the_pipeline_on_two_executors(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scaleout.py"), "--quick", "--workdir",
                           str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=1800)
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n--- stderr ---\n{done.stderr[-4000:]}"
    table = done.stdout.split("| master | records |", 1)[1].split("\n\n", 1)[0]     # the first table: the runs
    rows = {m.group(1): m for m in re.finditer(r"^\| (local\S*) \| ([\d,]+) \| ([\d.]+) \| ([\d,]+) \|",
                                               table, re.M)}
    assert set(rows) == {"local[2]", "local-cluster[2,1,1024]"}, done.stdout
    assert rows["local[2]"].group(2) == rows["local-cluster[2,1,1024]"].group(2) != "0"
    tasks = re.search(r"executors of the cluster run: \{(.*)\}", done.stdout).group(1)
    assert len(re.findall(r"': (\d+)", tasks)) == 2 and "': 0" not in tasks, tasks
    assert "verification (both runs against the simulated database and each other): ok" in done.stdout
    # under spark-submit (the driver JVM started first) Spark's Python processes are still forks of the warm server
    # where the installed changelake-worker-python starts them, as in the image
    if worker_python.script_path():
        forked = re.search(r"local\[2\]: Spark's Python processes forked by the driver's fork server: (\d+)",
                           done.stdout)
        assert forked and int(forked.group(1)) >= 3, done.stdout[-3000:]
