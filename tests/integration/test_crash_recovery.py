"""Exactly once across crashes: the pipeline process is killed with SIGKILL and restarted.

Kill points (``CHANGELAKE_FAULT``, see changelake.service.pipeline):

* ``after-first-table@1``: in the middle of batch 1, after one table's Delta commit and
  before the others: the batch is half applied when the process dies.
* ``after-sinks@1``: after every Delta commit of batch 1 and before Spark records the
  batch as done: on restart Spark replays batch 1, whose commits are already there.

After the restart the Delta tables must equal the source's final state: nothing lost,
nothing applied twice (the sink's per-batch transaction ids make the replay a no-op). A further
restart, which finds nothing new to do, must leave them so: once here (each run starts a JVM; what
it checks does not depend on where the earlier crash was), and after the graph pipeline's crash in
test_graph_pipeline.py.

The history is ~950 records, in as few micro-batches as each kill point needs: two (batches of 500) for
``after-first-table@1``, whose restart finishes the interrupted batch, the last; three (batches of 350)
for ``after-sinks@1``, which has applied all of batch 1 when it dies, so that the tables are behind the
source and the restart, after the replayed batch 1, has batch 2 to apply. More batches would only add
MERGEs (seconds of Spark jobs each with delta-spark) that prove nothing the kill point does not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from changelake.connectors.delta_read import read_delta
from changelake.service.demo import verify
from changelake.spark import delta_jars
from tests.jars import unavailable

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _run_pipeline(config_path, *, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CHANGELAKE_FAULT", None)
    if fault:
        env["CHANGELAKE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING",
                           "run", "--available-now", "-c", str(config_path)],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("fault, then_again, engine", [("after-first-table@1", False, "delta-rs"),
                                                       ("after-sinks@1", True, "delta-rs"),
                                                       ("after-first-table@1", False, "delta-spark")],
                         ids=["after-first-table@1", "after-sinks@1", "after-first-table@1-delta-spark"])
def test_sigkill_then_restart_applies_every_change_exactly_once(kafka, tmp_path, fault, then_again, engine):
    """With delta-spark each mirror's batch is merged on the executors (``apply_frame``), and the process
    dies between two tables' MERGEs."""
    if engine == "delta-spark" and delta_jars.missing():
        unavailable(f"delta-spark engine: {delta_jars.missing()}")
    prefix = kafka.topic("crash")
    db = write_history(kafka.bootstrap_servers, seed=23, changes=600, topic_prefix=prefix, redeliver=50)
    max_records = 500 if fault.startswith("after-first-table") else 350       # see the module docstring
    config, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=max_records,
                                   overrides={"storage": {"engine": engine}}, vacuum=engine == "delta-rs")

    crashed = _run_pipeline(path, fault=fault)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    # The crash left the tables behind the source.
    assert verify(config, db.state) != {t: "ok" for t in db.state}
    committed = {t: read_delta(config.table_path(t)).num_rows for t in db.state
                 if (tmp_path / "lake" / t).exists()}
    assert committed, "batch 0 should have been committed before the crash"

    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    if engine == "delta-spark":         # Delta for Spark wrote every commit of the tables (delta-rs: clientVersion)
        writers = {str(c.get("engineInfo", "delta-rs")).split("/")[0] for t in db.state
                   for c in DeltaTable(config.table_path(t)).history() if c.get("operation") == "MERGE"}
        assert writers == {"Apache-Spark"}, writers
    if not then_again:
        return

    again = _run_pipeline(path)            # a further restart finds nothing new to do
    assert again.returncode == 0, again.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
