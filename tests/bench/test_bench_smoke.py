"""Benchmarks never rot: every entry point in bench/ runs in its ``--quick`` mode, as a subprocess.

Each benchmark checks its own result (against DuckDB, a fold of the generated data, or the
generator's final state) and exits non-zero when it differs; these tests check the exit code and
that the figures were printed. No timing is asserted. Helper modules run through the entry points
that import them. A new ``bench/*.py`` must be added to ``SMOKE`` or ``HELPERS``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

#: entry point -> (arguments besides --quick, markers, what its output must show)
SMOKE: dict[str, tuple[list[str], tuple[str, ...], list[str]]] = {
    "decode.py": ([], ("unit",), [r"debezium-json .* events/s per core", r"debezium-avro .* events/s per core",
                                   r"canal-json .* rows/s per core",
                                   r"read-task \(a\) .* events/s per core \([\d.]+ µs per event"]),
    "kafka_read.py": ([], ("kafka",), [r"read +[\d,]+ records +[\d,]+ records/s per core",
                                        r"read \+ decode +[\d,]+ records +[\d,]+ records/s per core",
                                        r"kafka read run ok"]),
    "kafka_read.py readers": (["--reader", "both"], ("spark", "kafka"),
                              [r"round 1 python +[\d,]+ records in \d+ batches", r"round 1 spark-kafka +[\d,]+ records",
                               r"spark-kafka / python \(best of 1\): throughput [\d.]+", r"kafka read run ok"]),
    "sink.py": ([], ("unit",), [r"[\d,]+ changes/s; final state matches the expected rows"]),
    "joins.py lookup": (["lookup", "--dims", "delta,postgres"], ("unit",),
                        [r"\| delta \| cold \| [\d,]+ \|", r"\| delta \| warm \| [\d,]+ \|"]),
    "batch_latency.py": ([], ("spark", "kafka"), [r"per batch \(first left out\): median [\d.]+ s",
                                                   r"tables equal to the source: yes"]),
    "mirror.py": ([], ("spark", "kafka"), [r"[\d,]+ events/s end to end",
                                            r"verification against the generator's final state: ok",
                                            r"expired offsets \(must be 0\): 0"]),
    "operators.py": ([], ("spark", "kafka"), [r"\| a \| changelake \| [\d,]+ \| .* \| True \|",
                                               r"\| b \| changelake \| [\d,]+ \| .* \| True \|",
                                               r"batch 0: [\d,]+ records; Spark action .* driver \(Delta\)"]),
    "joins.py interval": (["interval"], ("spark",), [r"\| local \| [\d,]+ \| .* \| True \|",
                                                      r"\| spark \| [\d,]+ \| .* \| True \|"]),
    "state_design.py": ([], ("spark",), [r"\| jvm-signed \(RocksDB\) \| [\d,]+ \| .* \| True \|",
                                          r"\| bucketed kernel B=8 \| .* \| True \|",
                                          r"\| normalize by id .* \| True \|",
                                          r"\| per-key transformWithState .* \| True \|"]),
    "freshness.py": ([], ("spark", "kafka"), [r"\| products \| [\d,]+ \| [\d.]+ s \| [\d.]+ s \| [\d.]+ s \| 0 \|",
                                               r"\| category_stock \| [\d,]+ \| [\d.]+ s \|",
                                               r"records/s: offered [\d,]+", r"backlog .* at the end of production",
                                               r"freshness run ok"]),
    "freshness.py join": (["--join", "--stages"], ("spark", "kafka"),
                          [r"\| stateful operator 2 \(transformWithStateInPandas\) \| \d+ \| [\d,]+ \([\d,]+\) \|",
                           r"\| \*\*the batch's Spark jobs\*\* .* \| \| [\d,]+ \([\d,]+\) \|",
                           r"\| mirrors \(all\) \| [\d,]+ \| [\d.]+ s \| [\d.]+ s \| [\d.]+ s \| 0 \|",
                           r"\| graph tables \(all\) \| [\d,]+ \| [\d.]+ s \| [\d.]+ s \| [\d.]+ s \| 0 \|",
                           r"verification of category_top3 against the source's final state: ok",
                           r"verification of orders against the source's final state: ok",
                           r"records in the log twice \(.*must be 0\): 0\n",
                           r"freshness run ok"]),
    "soak.py": (["--store", "s3"], ("spark", "kafka"),
                [r"store: s3://", r"changelake-kill: 1", r"s3-errors: 1",
                 r"s3-errors from the start: 3 of the orders table's commit PUT\(s\) refused",
                 r"restart to first commit \(s\)", r"changes lost \(must be 0\): 0",
                 r"changes duplicated \(must be 0\): 0", r"soak run ok",
                 r"the run's data deleted \([\d.]+ GB; --keep-data keeps it\)"]),
    "restart.py": ([], ("spark", "kafka"), [r"cold start \(new checkpoint\): [\d.]+ s",
                                             r"\| \*\*median of the restarts\*\* \|( [\d.]+ \|){13}",
                                             r"changes lost \(must be 0\): 0", r"changes duplicated \(must be 0\): 0",
                                             r"restart run ok"]),
}
#: helper modules and what exercises them
HELPERS = {
    "common.py": "imported by operators.py, joins.py, state_design.py, freshness.py, mirror.py",
    "gen.py": "imported by decode.py, mirror.py, operators.py, freshness.py",
    "_interval.py": "run by joins.py interval",
    "spark_timing.py": ("BatchClock in operators.py and freshness.py (and test_batch_clock below), spark_stages in "
                        "operators.py, batch_stages and stage_table in freshness.py --join --stages"),
    "pyflink_ops_job.py": "run by operators.py in PyFlink's own interpreter, where apache-flink is installed",
    "scaleout.py": "run --quick by tests/integration/test_cluster_mode.py (two spark-submits: one slow test, not two)",
}


def _params() -> list:
    return [pytest.param(name, id=name.replace(".py", "").replace(" ", "-"),
                         marks=[getattr(pytest.mark, m) for m in marks])
            for name, (_, marks, _) in SMOKE.items()]


@pytest.mark.parametrize("name", _params())
def test_quick_run(name: str, tmp_path: Path) -> None:
    script = name.split()[0]
    args, _, expected = SMOKE[name]
    work_dir = ("mirror.py", "freshness.py", "soak.py", "restart.py")
    extra = ["--workdir", str(tmp_path / "work")] if script in work_dir else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(BENCH / script), *args, "--quick", *extra], cwd=tmp_path, env=env,
                          check=False, capture_output=True, text=True, timeout=1200)
    seconds = time.monotonic() - started
    tail = f"\n--- stdout (end) ---\n{done.stdout[-4000:]}\n--- stderr (end) ---\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{name} --quick exited {done.returncode} after {seconds:.0f}s{tail}"
    missing = [p for p in expected if not re.search(p, done.stdout)]
    assert not missing, f"{name} --quick did not print {missing}{tail}"
    if script == "soak.py":     # a passed run keeps its log and configuration, not its gigabytes of data
        assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["changelake.log", "pipeline.yaml"]


@pytest.mark.unit
def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")}
    covered = {n.split()[0] for n in SMOKE} | set(HELPERS)
    assert scripts == covered, (f"not covered: {sorted(scripts - covered)} (add them to SMOKE or HELPERS); "
                                f"gone: {sorted(covered - scripts)}")


@pytest.mark.unit
def test_batch_clock_times_the_foreach_batch_callable() -> None:
    """bench/spark_timing.py's BatchClock wraps the service's foreachBatch callable and its driver part:
    a fake batch through PipelineQuery.__call__ is timed, and everything is unwrapped afterwards."""
    import pyarrow as pa

    sys.path.insert(0, str(ROOT))
    from bench.spark_timing import BatchClock
    from changelake.service import pipeline
    from changelake.spark.query import PipelineQuery

    class Batch:
        def toArrow(self) -> pa.Table:
            return pa.table({"x": [1]})

    class Processor:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def process_decoded(self, out: pa.Table, batch_id: int, *, late_rows: dict, rejected=()) -> None:
            self.seen.append(batch_id)

    before = (PipelineQuery.__call__, pipeline.BatchProcessor.process_decoded, pipeline.BatchProcessor.__init__)
    processor = Processor()
    with BatchClock() as clock:
        PipelineQuery(processor, read_tasks=1)(Batch(), 7)
        PipelineQuery(processor, read_tasks=1)(Batch(), 8)
    assert processor.seen == [7, 8]
    assert len(clock.batches) == 2 and all(action >= 0 and driver >= 0 for action, driver in clock.batches)
    assert (PipelineQuery.__call__, pipeline.BatchProcessor.process_decoded,
            pipeline.BatchProcessor.__init__) == before
    with pytest.raises(RuntimeError, match="ran 3 micro-batch"):
        clock.check([{"batchId": 0}, {"batchId": 1}, {"batchId": 2}])


@pytest.mark.unit
def test_stage_table_reads_each_micro_batch_from_the_event_log(tmp_path: Path) -> None:
    """bench/spark_timing.py's batch_stages groups a Spark event log's stages by micro-batch id and names the
    stateful ones by their place; stage_table gives the median over the batches asked for, nothing else."""
    import json

    from bench.spark_timing import batch_stages, stage_table

    def stage(sid: int, rdd: str, wall: int, commit: int) -> dict:
        return {"Event": "SparkListenerStageCompleted", "Stage Info": {
            "Stage ID": sid, "Number of Tasks": 2, "Submission Time": 1000 * sid, "Completion Time": 1000 * sid + wall,
            "RDD Info": [{"Name": rdd}],
            "Accumulables": [{"Name": "internal.metrics.executorRunTime", "Value": 2 * wall},
                             {"Name": "time to commit changes", "Value": commit}]}}

    events = []
    for batch, scale in ((7, 1), (8, 3), (9, 100)):        # batch 9: not asked for
        first = 10 * batch
        events += [{"Event": "SparkListenerJobStart", "Job ID": batch, "Submission Time": 1000 * first,
                    "Stage IDs": [first, first + 1, first + 2],
                    "Properties": {"streaming.sql.batchId": str(batch)}},
                   stage(first, "DataSourceRDD", 100 * scale, 0), stage(first + 1, "StateStoreRDD", 200 * scale, 50),
                   stage(first + 2, "StateStoreRDD", 300 * scale, 60),
                   {"Event": "SparkListenerJobEnd", "Job ID": batch, "Completion Time": 1000 * first + 2500}]
    events.append({"Event": "SparkListenerJobStart", "Job ID": 99, "Submission Time": 0, "Stage IDs": [999],
                   "Properties": {}})           # not a micro-batch's job
    (tmp_path / "app-1").write_text("\n".join(json.dumps(e) for e in events))
    batches = batch_stages(tmp_path)
    assert sorted(batches) == [7, 8, 9]
    assert [s["what"] for s in batches[7]["stages"]] == [
        "Kafka read + decode + route (source tasks)", "stateful operator 1 (transformWithStateInPandas)",
        "stateful operator 2 (transformWithStateInPandas)"]
    assert batches[8]["job_ms"] == 2500 and batches[8]["stages"][2]["wall_ms"] == 900
    table = stage_table(batches, [7, 8], driver_s=[0.1, 0.3])
    assert "| stateful operator 2 (transformWithStateInPandas) | 2 | 600 (840) | 1,200 (1,680) | 0 (0) | 60 (60) |" \
        in table
    assert "| driver part (Delta commits, dead letters) | | 200 (280) |" in table
