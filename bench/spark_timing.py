"""Where a changelake pipeline's time goes: clocks around the service's micro-batches and
per-stage times from Spark's event log (``spark.eventLog.enabled``, uncompressed, not rolling)."""

from __future__ import annotations

import json
import time
from pathlib import Path


class BatchClock:
    """Times each micro-batch's Spark action (read, decode, operators, collect) and driver part (Delta)."""

    def __enter__(self):
        from changelake.service import pipeline, runner

        self.batches: list[tuple[float, float]] = []        # (spark action s, driver s)
        self.setup: dict[str, float] = {}                   # pipeline set-up steps outside the batches
        cls = self._cls = pipeline.BatchProcessor
        self._runner = runner
        self._init, self._start = init, start = cls.__init__, runner.start_query
        self._call, self._process = call, process = cls.__call__, cls.process_decoded
        driver: list[float] = []

        def timed_init(proc, *args, **kwargs):
            t = time.perf_counter()
            init(proc, *args, **kwargs)
            self.setup["plan, sinks, decode stage"] = time.perf_counter() - t

        def timed_start(*args, **kwargs):
            t = time.perf_counter()
            query = start(*args, **kwargs)
            self.setup["query start (streaming graph, Python data source)"] = time.perf_counter() - t
            return query

        def timed_process(proc, out, batch_id):
            t = time.perf_counter()
            try:
                return process(proc, out, batch_id)
            finally:
                driver.append(time.perf_counter() - t)

        def timed_call(proc, batch_df, batch_id):
            t = time.perf_counter()
            driver.clear()
            call(proc, batch_df, batch_id)
            total = time.perf_counter() - t
            self.batches.append((total - sum(driver), sum(driver)))

        cls.__call__, cls.process_decoded, cls.__init__ = timed_call, timed_process, timed_init
        runner.start_query = timed_start
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.__call__, self._cls.process_decoded, self._cls.__init__ = self._call, self._process, self._init
        self._runner.start_query = self._start


def spark_stages(eventlog: Path) -> dict[str, list[dict]]:
    """Per streaming query id: its stages by position in the micro-batch job, summed over batches
    (wall ms, task time ms, Python code ms), from Spark's event log. ``what`` is a guess from the
    stage's RDDs: a stage ends at a shuffle, so it may hold more than the operator it is named for."""
    stage_query: dict[int, tuple[str, int]] = {}
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(eventlog.rglob("*")):
        if not path.is_file() or path.name.startswith(".") or "appstatus" in path.name:
            continue
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["Event"] == "SparkListenerJobStart":
                qid = (e.get("Properties") or {}).get("sql.streaming.queryId")
                if qid:
                    for i, sid in enumerate(sorted(e["Stage IDs"])):
                        stage_query[sid] = (qid, i)
            elif e["Event"] == "SparkListenerStageCompleted" and e["Stage Info"]["Stage ID"] in stage_query:
                info = e["Stage Info"]
                qid, pos = stage_query[info["Stage ID"]]
                acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}
                rdds = {r["Name"] for r in info["RDD Info"]}
                what = ("read Kafka + decode" if "DataSourceRDD" in rdds else
                        "stateful operator (transformWithStateInPandas)" if "StateStoreRDD" in rdds else
                        "unpack sources + shuffle")
                s = out.setdefault(qid, {}).setdefault(pos, {"what": what, "tasks": 0, "wall_ms": 0, "task_ms": 0,
                                                             "python_ms": 0, "batches": 0})
                s["batches"] += 1
                s["tasks"] += info["Number of Tasks"]
                s["wall_ms"] += info.get("Completion Time", 0) - info.get("Submission Time", 0)
                s["task_ms"] += int(acc.get("internal.metrics.executorRunTime", 0))
                s["python_ms"] += int(acc.get("time to execute Python code", 0))
    return {qid: [stages[p] for p in sorted(stages)] for qid, stages in out.items()}
