"""Feeds metrics and health from Spark's streaming progress reports."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from changelake import metrics

log = logging.getLogger(__name__)


def parse_offsets(value: Any) -> dict[str, dict[str, int]]:
    """Offsets from a progress entry, which Spark gives as JSON text or as a dict (``"null"`` when unknown:
    e.g. the latest offset of a restarted available-now query whose only batch was a replay)."""
    if not value:
        return {}
    return (json.loads(value) if isinstance(value, str) else dict(value)) or {}


def lag_by_partition(source_progress: dict[str, Any]) -> dict[tuple[str, str], int]:
    """End offset minus the last committed offset, from one source's progress entry."""
    latest = parse_offsets(source_progress.get("latestOffset"))
    done = parse_offsets(source_progress.get("endOffset"))
    lag: dict[tuple[str, str], int] = {}
    for topic, parts in latest.items():
        for p, high in parts.items():
            lag[(topic, p)] = max(0, int(high) - int(done.get(topic, {}).get(p, 0)))
    return lag


class ProgressListener(StreamingQueryListener):
    """``query``: the name of the one query it follows (None: every query's reports); ``lags``: shared by the
    listeners of one pipeline's queries (query -> (topic, partition) -> lag), so that a partition's lag
    gauges show the query furthest behind."""

    def __init__(self, health: Any, *, on_progress: Any = None, query: str | None = None,
                 lags: dict[str, dict[tuple[str, str], int]] | None = None) -> None:
        # health: the service's Health (duck-typed: this wing imports no service); on_progress(progress dict)
        self.health = health
        self.on_progress = on_progress
        self.query = query
        self.lags = lags if lags is not None else {}
        self.last_lag: dict[tuple[str, str], int] = {}
        self._seen: set[int] = set()
        self._newest = -1
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        log.info("streaming query %s started; its first micro-batch also starts Spark's Python workers and "
                 "compiles the plan, which can take a minute or more on a busy machine", event.name)

    def onQueryProgress(self, event: Any) -> None:
        p = json.loads(event.progress.json)
        if self.query is None or p.get("name") == self.query:
            self.record_progress(p)

    def record_progress(self, p: dict[str, Any]) -> None:
        """Update metrics and health from one progress report (a dict of Spark's progress JSON). Each batch
        counts once, whether its report comes from Spark's listener bus or from the runner at the end (the
        bus delivers late: the last batch's report may come after the query stopped); lag comes from the
        newest batch only."""
        batch = p.get("batchId")
        with self._lock:
            if batch is not None:
                if batch in self._seen:
                    return
                self._seen.add(batch)
            newest = batch is None or batch > self._newest
            if batch is not None and newest:
                self._newest = batch
            durations = p.get("durationMs", {})
            # numInputRows counts the decode stage's payloads (a few per read task), not Kafka records: the
            # batch's records reach changelake_batch_input_rows from the batch processor
            if "triggerExecution" in durations and p.get("numInputRows", 0) > 0:
                metrics.BATCH_SECONDS.observe(durations["triggerExecution"] / 1000.0)
                metrics.BATCHES.inc()
            if not newest:
                return
            metrics.LAST_BATCH_TS.set(time.time())
            self.health.batch_finished(p)
            now, started = time.time(), metrics.PROCESS_START._value.get()
            mine = self.lags.setdefault(self.query or "", {})
            for source in p.get("sources", []):
                lag = lag_by_partition(source)
                mine.update(lag)
                for (topic, part), _ in lag.items():
                    n = max(q.get((topic, part), 0) for q in self.lags.values())
                    metrics.CONSUMER_LAG.labels(topic, part).set(n)
                    metrics.CONSUMER_LAG_SECONDS.labels(topic, part).set(
                        metrics.READ_TIMES.lag_seconds(topic, part, n, now=now, started=started))
                self.last_lag.update(lag)
        if self.on_progress is not None:
            self.on_progress(p)

    def onQueryIdle(self, event: Any) -> None:
        metrics.LAST_BATCH_TS.set(time.time())
        self.health.batch_finished(None)

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            log.error("streaming query stopped with an error: %s", event.exception)


def work_done(spark: Any) -> tuple | None:
    """What the application's running stages have done so far, as Spark's status store knows it (executors
    report their running tasks' metrics in heartbeats, every ``spark.executor.heartbeatInterval``): per
    active stage (id, attempt), its tasks finished and records read, shuffled and written. It changes while a
    batch makes progress, a long first batch included, and stays the same while a batch hangs. None when
    the store cannot be read (no classic JVM gateway, or the JVM is going away)."""
    try:
        stages = spark.sparkContext._jsc.sc().statusStore().activeStages()
        out = []
        for i in range(stages.size()):
            s = stages.apply(i)
            out.append((s.stageId(), s.attemptId(), s.numCompleteTasks(), s.inputRecords(), s.outputRecords(),
                        s.shuffleReadRecords(), s.shuffleWriteRecords()))
        return tuple(sorted(out))
    except Exception:       # Spark Connect, a stopped context, a broken gateway: unknown, not progress
        return None
