"""Where a changelake pipeline's time goes: clocks around the service's micro-batches and
per-stage times from Spark's event log (``spark.eventLog.enabled``, uncompressed, not rolling)."""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
from pathlib import Path


def _wrap(owner: object, name: str, around) -> tuple[object, str, object]:
    """Replace ``owner.name`` by ``around(original)``; returns what ``__exit__`` needs to undo it.
    Raises when the attribute is gone, so that a refactoring of the service breaks the clock loudly."""
    original = inspect.getattr_static(owner, name, None)
    if original is None:
        raise RuntimeError(f"bench/spark_timing.py: {getattr(owner, '__name__', owner)}.{name} is gone; "
                           "update BatchClock to the pipeline's new layout")
    setattr(owner, name, functools.wraps(original)(around(getattr(owner, name))))
    return owner, name, original


class BatchClock:
    """Times each micro-batch of a service pipeline run in this process.

    Per batch: the whole ``foreachBatch`` call (:meth:`changelake.spark.query.PipelineQuery.__call__`)
    split into its Spark action (read, decode, operators, collect: everything but the driver part)
    and its driver part (:meth:`changelake.service.pipeline.BatchProcessor.process_decoded`: sinks,
    dead letters). Outside the batches: building the processor (plan, sinks, decode stage) and
    starting the query (streaming graph, Python data source), as the service runner calls them.

    ``batches``: ``[(spark action s, driver s)]`` in batch order. :meth:`check` raises unless every
    batch the query reported was timed (use it after the run: it is what keeps this clock honest).
    """

    def __init__(self) -> None:
        self.batches: list[tuple[float, float]] = []        # (spark action s, driver s)
        self.records: list[int] = []                        # Kafka records of each batch (the processor's report)
        self.setup: dict[str, float] = {}                   # pipeline set-up steps outside the batches
        self._undo: list = []

    def __enter__(self) -> "BatchClock":
        from changelake.service import pipeline, runner
        from changelake.spark import query

        # per thread: a pipeline of two queries (mirrors in their own, changelake.service.split) runs two
        # micro-batches at once, each in its query's thread
        drivers: dict[int, list[float]] = {}

        def timed(label: str):
            def around(fn):
                def call(*args, **kwargs):
                    t = time.perf_counter()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        self.setup[label] = self.setup.get(label, 0.0) + time.perf_counter() - t
                return call
            return around

        def driver_part(fn):
            def call(*args, **kwargs):
                t = time.perf_counter()
                try:
                    report = fn(*args, **kwargs)
                    self.records.append(getattr(report, "records", 0))
                    return report
                finally:
                    drivers.setdefault(threading.get_ident(), []).append(time.perf_counter() - t)
            return call

        def whole_batch(fn):
            def call(*args, **kwargs):
                t = time.perf_counter()
                driver = drivers.setdefault(threading.get_ident(), [])
                driver.clear()
                fn(*args, **kwargs)
                total = time.perf_counter() - t
                self.batches.append((total - sum(driver), sum(driver)))
            return call

        try:
            self._undo.append(_wrap(pipeline.BatchProcessor, "__init__", timed("plan, sinks, decode stage")))
            # the runner imported start_query by name: the clock wraps the name the runner calls
            self._undo.append(_wrap(runner, "start_query",
                                    timed("query start (streaming graph, Python data source)")))
            self._undo.append(_wrap(pipeline.BatchProcessor, "process_decoded", driver_part))
            self._undo.append(_wrap(query.PipelineQuery, "__call__", whole_batch))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo = []

    def check(self, progress: list[dict]) -> None:
        """Raise unless the clock timed as many batches as the query ran (``RunResult.progress``,
        Spark's recent progress; each entry with a ``batchId``). For ``availableNow`` runs: with a
        processing-time trigger, an idle trigger reports the next batch's id before it runs."""
        ran = len({p["batchId"] for p in progress})
        if ran and len(self.batches) != ran:
            raise RuntimeError(f"bench/spark_timing.py: the query ran {ran} micro-batch(es) but BatchClock timed "
                               f"{len(self.batches)}; the foreachBatch callable moved, update BatchClock")
        if "plan, sinks, decode stage" not in self.setup or len(self.setup) != 2:
            raise RuntimeError(f"bench/spark_timing.py: set-up steps timed: {sorted(self.setup)}; the pipeline's "
                               "assembly moved, update BatchClock")


def _events(eventlog: Path):
    """Every event of an (uncompressed) Spark event log directory, file by file."""
    for path in sorted(eventlog.rglob("*")):
        if not path.is_file() or path.name.startswith(".") or "appstatus" in path.name:
            continue
        for line in path.read_text().splitlines():
            yield json.loads(line)


def spark_stages(eventlog: Path) -> dict[str, list[dict]]:
    """Per streaming query id: its stages by position in the micro-batch job, summed over batches
    (wall ms, task time ms, Python code ms), from Spark's event log. ``what`` is a guess from the
    stage's RDDs: a stage ends at a shuffle, so it may hold more than the operator it is named for."""
    stage_query: dict[int, tuple[str, int]] = {}
    out: dict[str, dict[int, dict]] = {}
    for e in _events(eventlog):
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
            what = ("read Kafka + decode (+ route to the graph)" if "DataSourceRDD" in rdds else
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


#: SQL metrics of a stateful operator (summed over the stage's tasks) that the stage table shows
_STATE_METRICS = {"time to commit changes": "commit_ms", "time to update": "update_ms",
                  "time to remove": "remove_ms", "time to execute Python code": "python_ms"}


def batch_stages(eventlog: Path) -> dict[int, dict]:
    """Per micro-batch id (``streaming.sql.batchId`` of its jobs): the batch's Spark jobs' wall time
    (``job_ms``: first job start to last job end) and its completed stages in submission order, each
    ``{"what", "tasks", "wall_ms", "task_ms", "python_ms", "commit_ms", "update_ms", "remove_ms"}``
    (task figures summed over the stage's tasks). ``what`` names the stage by its RDDs: the source stage
    (``DataSourceRDD``: Kafka read + decode + route), the stateful stages (``StateStoreRDD``: one
    ``transformWithStateInPandas`` operator; numbered by their place in the batch), the rest."""
    jobs: dict[int, int] = {}                       # job id -> batch id
    stage_batch: dict[int, int] = {}
    out: dict[int, dict] = {}
    for e in _events(eventlog):
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            bid = (e.get("Properties") or {}).get("streaming.sql.batchId")
            if bid is None:
                continue
            jobs[e["Job ID"]] = int(bid)
            b = out.setdefault(int(bid), {"start": e["Submission Time"], "end": e["Submission Time"],
                                          "stages": []})
            b["start"] = min(b["start"], e["Submission Time"])
            for sid in e["Stage IDs"]:
                stage_batch[sid] = int(bid)
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            b = out[jobs[e["Job ID"]]]
            b["end"] = max(b["end"], e["Completion Time"])
        elif kind == "SparkListenerStageCompleted" and e["Stage Info"]["Stage ID"] in stage_batch:
            info = e["Stage Info"]
            acc: dict[str, int] = {}
            for a in info.get("Accumulables", []):
                try:
                    acc[a["Name"]] = acc.get(a["Name"], 0) + int(a.get("Value") or 0)
                except (TypeError, ValueError):
                    pass
            rdds = {r["Name"] for r in info["RDD Info"]}
            stage = {"id": info["Stage ID"], "submitted": info.get("Submission Time", 0),
                     "what": "source" if "DataSourceRDD" in rdds else
                     "stateful" if "StateStoreRDD" in rdds else "other",
                     "tasks": info["Number of Tasks"],
                     "wall_ms": info.get("Completion Time", 0) - info.get("Submission Time", 0),
                     "task_ms": acc.get("internal.metrics.executorRunTime", 0)}
            stage.update({key: acc.get(name, 0) for name, key in _STATE_METRICS.items()})
            out[stage_batch[info["Stage ID"]]]["stages"].append(stage)
    for b in out.values():
        b["job_ms"] = b.pop("end") - b.pop("start")
        b["stages"].sort(key=lambda s: (s["submitted"], s["id"]))
        level = 0
        for s in b["stages"]:
            if s["what"] == "stateful":
                level += 1
                s["what"] = f"stateful operator {level} (transformWithStateInPandas)"
            elif s["what"] == "source":
                s["what"] = "Kafka read + decode + route (source tasks)"
            else:
                s["what"] = "other (shuffle, collect)"
    return out


def stage_table(batches: dict[int, dict], ids: list[int], driver_s: list[float] | None = None,
                progress: list[dict] | None = None) -> str:
    """A markdown table of the median (p90) per stage over the micro-batches ``ids`` (those with the
    most common stage layout), plus the batch's Spark job, the driver part (``driver_s``: seconds per
    batch, e.g. BatchClock's) and the parts Spark's progress reports (``durationMs``) for those ids."""
    import numpy as np
    from collections import Counter

    chosen = [batches[i] for i in ids if i in batches]
    if not chosen:
        return "(no micro-batch of those ids in the event log)"
    layout = Counter(tuple(s["what"] for s in b["stages"]) for b in chosen).most_common(1)[0][0]
    same = [b for b in chosen if tuple(s["what"] for s in b["stages"]) == layout]

    def fmt(values) -> str:
        p50, p90 = np.percentile(values, [50, 90])
        return f"{p50:,.0f} ({p90:,.0f})"

    lines = [f"{len(same)} micro-batches (of {len(chosen)}; the rest had another stage layout); ms, median (p90); "
             "task, Python, commit and update times are summed over the stage's tasks",
             "", "| part | tasks | wall | task time | Python | state commit | state update |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for pos, what in enumerate(layout):
        col = [b["stages"][pos] for b in same]
        lines.append(f"| {what} | {col[0]['tasks']} | {fmt([s['wall_ms'] for s in col])} | "
                     f"{fmt([s['task_ms'] for s in col])} | {fmt([s['python_ms'] for s in col])} | "
                     f"{fmt([s['commit_ms'] for s in col])} | {fmt([s['update_ms'] for s in col])} |")
    lines.append(f"| **the batch's Spark jobs** (first start to last end) | | {fmt([b['job_ms'] for b in same])} "
                 "| | | | |")
    if driver_s:
        lines.append(f"| driver part (Delta commits, dead letters) | | {fmt([d * 1000 for d in driver_s])} | | | | |")
    by_id = {p["batchId"]: p for p in progress or () if p.get("numInputRows")}
    steady = [by_id[i] for i in ids if i in by_id]
    if steady:
        parts = sorted({k for p in steady for k in p.get("durationMs", {})})
        for k in parts:
            lines.append(f"| progress `durationMs.{k}` | | {fmt([p['durationMs'].get(k, 0) for p in steady])} "
                         "| | | | |")
    return "\n".join(lines)


def batch_jobs(eventlog: Path) -> dict[int, list[dict]]:
    """Per streaming batch id: the Spark jobs its micro-batch ran, in order, each with where it was
    called (``callSite.short``: the Python line of the action), its wall time (job start to end, ms),
    stages and tasks (skipped stages left out, as the SQL tab shows them). Jobs outside a streaming
    batch are under -1 (table set-up of a sink benchmark, for instance)."""
    jobs: dict[int, dict] = {}
    stage_tasks: dict[int, int] = {}
    for e in _events(eventlog):
        if e["Event"] == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            batch = props.get("streaming.sql.batchId")
            jobs[e["Job ID"]] = {"batch": int(batch) if batch is not None else -1,
                                 "site": props.get("callSite.short", "?"),
                                 "description": _first_line(props.get("spark.job.description") or ""),
                                 "start": e["Submission Time"], "stages": set(e["Stage IDs"])}
        elif e["Event"] == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            stage_tasks[info["Stage ID"]] = info["Number of Tasks"]
        elif e["Event"] == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["ms"] = e["Completion Time"] - jobs[e["Job ID"]]["start"]
    out: dict[int, list[dict]] = {}
    for job_id, job in sorted(jobs.items()):
        ran = [s for s in job["stages"] if s in stage_tasks]
        out.setdefault(job["batch"], []).append({
            "job": job_id, "site": job["site"], "description": job["description"], "ms": job.get("ms", 0),
            "stages": len(ran), "tasks": sum(stage_tasks[s] for s in ran)})
    return out


def _first_line(description: str) -> str:
    """The step a job belongs to: the first line of its description (changelake's sink steps,
    changelake/spark/delta_sink.py ``described``; Delta prefixes its own jobs with ``Delta: ``)."""
    return description.splitlines()[0][:90] if description else ""


def print_batch_jobs(eventlog: Path) -> None:
    """:func:`batch_jobs` as a table per batch."""
    for batch, jobs in sorted(batch_jobs(eventlog).items()):
        total = sum(j["ms"] for j in jobs)
        print(f"batch {batch}: {len(jobs)} Spark jobs, {total / 1000:.2f} s of job wall time")
        steps: dict[str, list[float]] = {}
        for j in jobs:
            step = steps.setdefault(j["description"].replace("Delta: ", ""), [0, 0.0])
            step[0] += 1
            step[1] += j["ms"] / 1000
        for name, (n, seconds) in steps.items():
            print(f"  {n:3d} job(s) {seconds:7.2f} s  {name}")
        for j in jobs:
            print(f"    job {j['job']:4d} {j['ms'] / 1000:7.2f} s  {j['stages']} stage(s) {j['tasks']:4d} task(s)  "
                  f"{j['site']}  {j['description']}")
