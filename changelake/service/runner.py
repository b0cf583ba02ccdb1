"""Runs one pipeline: Spark session, HTTP endpoint, progress listener, query, graceful stop."""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from changelake import metrics
from changelake.service.broker_watch import BrokerWatch
from changelake.service.catchup import CatchUpTracker, format_progress_line
from changelake.service.config import ChangelakeConfig, parse_duration
from changelake.service.http import Health, HttpEndpoint
from changelake.service.lease import Lease, LeaseLost
from changelake.service.lifecycle import read_tombstone_tables
from changelake.service.logs import TerminalStderr, log_format
from changelake.service.pipeline import BatchProcessor, BatchReport
from changelake.service.query_start import start_query
from changelake.service.preflight import broker_topics, side_topic, skipped_side_topics
from changelake.service.split import MIRRORS_APP, split
from changelake.service.restart_clock import RestartClock
from changelake.spark import fork_server
from changelake.spark.checkpoint import checkpoint_store_problem
from changelake.spark.progress import ProgressListener, parse_offsets, work_done
from changelake.spark.session import build_session, driver_jvm, executor_tasks, executor_times

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    totals: BatchReport
    lag: dict[tuple[str, str], int]
    end_offsets: dict[str, dict[str, int]]
    progress: list[dict[str, Any]]
    metrics_url: str | None
    stopped_by_signal: bool
    #: seconds from the query's start to its end (Spark start-up not included)
    seconds: float = 0.0
    #: executor id -> tasks it ran (empty in local mode, where the driver runs every task)
    executors: dict[str, int] = field(default_factory=dict)

    @property
    def records_per_second(self) -> float:
        return self.totals.records / self.seconds if self.seconds > 0 else 0.0


class PipelineRunner:
    def __init__(self, config: ChangelakeConfig, *, serve_http: bool = True, spark: Any = None) -> None:
        self.config = config
        self.serve_http = serve_http
        self._spark = spark
        self._stop = threading.Event()
        self.endpoint: HttpEndpoint | None = None
        #: the running query's batch processor (its ``totals``), once :meth:`run` started it
        self.processor: BatchProcessor | None = None
        #: restart to first commit (``changelake.service.restart_clock``), set by :meth:`run`
        self.clock: RestartClock | None = None
        self._signals = False           # the runner installed its signal handlers
        self.health = Health(max_silence_s=parse_duration(config.pipeline.trigger_interval)
                             * config.metrics.ready_after_intervals + 60,
                             stalled_after_s=parse_duration(config.metrics.stalled_after))

    def request_stop(self, *_: Any) -> None:
        """Ask for a graceful stop: the running micro-batch finishes, then the query stops."""
        if not self._stop.is_set():
            log.info("stop requested; finishing the current micro-batch")
        self._stop.set()

    def run(self, *, available_now: bool | None = None, install_signal_handlers: bool = True,
            rebuild_views: bool = False) -> RunResult:
        cfg = self.config
        self.clock = clock = RestartClock()
        clock.mark("start")
        self._signals = install_signal_handlers and threading.current_thread() is threading.main_thread()
        if self._signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        topics = broker_topics(cfg)     # an unreachable broker: one line (SourceError) within seconds, before Spark
        clock.mark("preflight")
        for topic, source in skipped_side_topics(cfg, topics).items():
            metrics.TOPICS_SKIPPED.labels(topic, side_topic(topic) or "").set(1)
            log.info("source %s: topic_pattern matches %s, a Debezium %s topic: not read (no row changes; "
                     "docs/pipelines.md, 'Topic patterns')", source, topic, side_topic(topic))
        store = checkpoint_store_problem(cfg.pipeline.checkpoint, cfg.pipeline.spark_conf)
        if store:           # the launcher may still put the connector on the classpath (spark-submit --jars)
            log.warning("%s", store)
        lease = Lease.for_config(cfg)
        lease.acquire()     # a second instance of the pipeline stops here: LeaseHeld (changelake.service.lease)
        clock.mark("lease")
        lease.start_renewing()
        try:
            return self._run(lease, available_now=available_now, rebuild_views=rebuild_views)
        finally:
            lease.release()

    def _run(self, lease: Lease, *, available_now: bool | None, rebuild_views: bool) -> RunResult:
        cfg = self.config
        parts = split(cfg, rebuild_views=rebuild_views)
        # in seconds, before the JVM starts; the lease is held, so what it read holds for the start
        recorded = refuse_bad_start(cfg, parts, rebuild_views=rebuild_views)
        self.clock.mark("check")
        tombstone_reads = [read_tombstone_tables(start.logs, cfg.storage.plain_options() or None,
                                                 keys=_sinks_on_delta_rs(cfg)) for start in recorded]
        watch = None
        if self.serve_http:
            self.endpoint = HttpEndpoint(self.health, host=cfg.metrics.host, port=cfg.metrics.port).start()
            log.info("metrics and health on %s", self.endpoint.url("/"))
            watch = BrokerWatch.for_config(cfg).start()     # changelake_broker_* (service.broker_watch)
        try:
            return self._run_query(lease, parts, available_now=available_now, rebuild_views=rebuild_views,
                                   recorded=recorded, tombstone_reads=tombstone_reads)
        finally:
            if watch is not None:
                watch.stop()

    def _run_query(self, lease: Lease, parts: Any, *, available_now: bool | None, rebuild_views: bool,
                   recorded: list[Any] | None = None, tombstone_reads: list[dict] | None = None) -> RunResult:
        cfg = self.config
        conf = dict(cfg.pipeline.spark_conf)
        if log_format() == "json":      # Spark's log4j lines as JSON objects too (changelake.service.logs)
            conf.setdefault("spark.log.structuredLogging.enabled", "true")
        if parts is not None:       # the mirrors in a query of their own: FAIR pools, so neither waits for the other
            conf.setdefault("spark.scheduler.mode", "FAIR")
        terminal = _CatchUpLine.for_run(cfg)     # before the JVM starts: its stderr goes around the progress line
        spark = self._spark
        if spark is None:
            spark = build_session(app_name=f"changelake-{cfg.pipeline.id}", master=cfg.pipeline.master, conf=conf,
                                  engine=cfg.storage.engine,
                                  jar_sets=("spark-kafka",) if cfg.kafka.reader == "spark-kafka" else ())
            if self._signals:
                # pyspark's SIGINT handler (cancel every job, raise KeyboardInterrupt wherever the driver is)
                # replaced the runner's when the session started: Ctrl-C stops between batches, as SIGTERM does
                signal.signal(signal.SIGINT, self.request_stop)
        clock = self.clock
        clock.mark("session")
        metrics.JVM.watch(*driver_jvm(spark), workers_under=fork_server.server_pid())
        lags: dict = {}
        if parts is None:
            runs = [(cfg, BatchProcessor(cfg, spark=spark), None)]
        else:
            graph_tables = {t.name for t in parts.graph.tables}
            log.info("the mirrors run in a streaming query of their own (checkpoint %s): they commit on their own "
                     "cadence, whatever the views' batches take (pipeline.mirrors: own_query)",
                     parts.mirrors.pipeline.checkpoint)
            # the graph's query starts first: a refused start (changed views, a stale checkpoint) is refused
            # before the mirrors' query reads anything
            runs = [(parts.graph, BatchProcessor(parts.graph, spark=spark, accounted_elsewhere=parts.elsewhere),
                     lambda name: name in graph_tables),
                    (parts.mirrors, BatchProcessor(parts.mirrors, spark=spark, graph=None, query=MIRRORS_APP),
                     lambda name: name not in graph_tables)]
        listeners = []
        for run_cfg, processor, _ in runs:
            listener = ProgressListener(self.health, on_progress=terminal.show if processor is runs[-1][1] else None,
                                        query=None if parts is None else cfg.pipeline.id + processor.query_name,
                                        lags=lags)
            spark.streams.addListener(listener)
            listeners.append(listener)
        for i, (_, processor, _) in enumerate(runs):
            processor.lease = lease
            processor.clock = clock
            if recorded:
                processor.logs_read = {**recorded[i].logs, **(tombstone_reads[i] if tombstone_reads else {})}
        self.processor = runs[0][1]
        started = time.monotonic()
        queries = []
        try:
            for i, (run_cfg, processor, writes) in enumerate(runs):
                if parts is not None:
                    spark.sparkContext.setLocalProperty("spark.scheduler.pool", processor.query_name or "graph")
                queries.append(start_query(spark, run_cfg, processor, available_now=available_now,
                                           rebuild_views=rebuild_views, writes=writes,
                                           recorded=recorded[i].positions if recorded else None))
        except BaseException:
            for q in queries:
                q.stop()
            raise
        finally:
            if parts is not None:
                spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
        clock.mark("query")
        self.health.query_active = lambda: all(q.isActive for q in queries)
        self.health.trigger_active = lambda: any(q.status.get("isTriggerActive", False) for q in queries)
        self.health.work = lambda: work_done(spark)
        sampled = [0.0]

        def sample_work() -> None:      # /livez: is a running batch moving?
            if time.monotonic() - sampled[0] >= self.WORK_SAMPLE_S:
                sampled[0] = time.monotonic()
                self.health.sample_work()
        try:
            # a lease taken over stops the queries between batches: no batch would write
            _await(queries, lambda: self._stop.is_set() or lease.lost is not None, sample_work)
            if lease.lost is not None:
                raise LeaseLost(lease.lost)
        finally:
            seconds = time.monotonic() - started
            for listener in listeners:
                listener.on_progress = None
            terminal.end()
            # Progress events reach the listener asynchronously, the last batch's maybe after the end: every
            # batch's report is recorded here, before /metrics stops, so its final figures count every batch.
            for listener, query in zip(listeners, queries):
                for report in query.recentProgress:
                    listener.record_progress(report)
                spark.streams.removeListener(listener)
            for _, processor, _ in runs:
                processor.close()
            if self.endpoint is not None and not self.serve_http_after_stop:
                self.endpoint.stop()
        # per partition, the end offset of the query furthest behind among those that read it
        end_offsets: dict[str, dict[str, int]] = {}
        for query in queries:
            last = query.lastProgress
            found = parse_offsets(last["sources"][0].get("endOffset")) if last and last.get("sources") else {}
            for topic, parts in found.items():
                mine = end_offsets.setdefault(topic, {})
                for part, offset in parts.items():
                    mine[part] = min(int(offset), mine.get(part, int(offset)))
        executors = executor_tasks(spark)
        if executors:
            log.info("ran on %d executor(s): %s", len(executors),
                     ", ".join(f"executor {e}: {n} task(s)" for e, n in sorted(executors.items())))
        log.info("task time: %s", ", ".join(f"{e}: {run:.1f} s, GC {gc:.1f} s, shuffle read {read:,} bytes"
                                            for e, (run, gc, read) in sorted(executor_times(spark).items())))
        lag: dict[tuple[str, str], int] = {}
        for listener in listeners:
            for tp, n in listener.last_lag.items():
                lag[tp] = max(lag.get(tp, 0), n)
        return RunResult(totals=_totals([p for _, p, _ in runs]), lag=lag, end_offsets=end_offsets,
                         progress=[r for q in queries for r in q.recentProgress],
                         metrics_url=self.endpoint.url() if self.endpoint else None,
                         stopped_by_signal=self._stop.is_set(), seconds=seconds, executors=executors)

    #: seconds between two looks at the running batch's work (changelake.service.http, /livez)
    WORK_SAMPLE_S = 5.0

    #: keep the endpoint up after the query ends (the demo prints the URL and lets you scrape it)
    serve_http_after_stop = False


def _sinks_on_delta_rs(config: ChangelakeConfig) -> bool:
    """The sinks will write with delta-rs (``storage.engine``; auto: on a local master, as the Spark wing's
    ``open_sink`` picks it, a master the launcher sets counted as local)."""
    engine = config.storage.engine
    return engine == "delta-rs" or engine == "auto" and str(config.pipeline.master or "local").startswith("local")


def refuse_bad_start(config: ChangelakeConfig, parts: Any, *, rebuild_views: bool = False) -> list[Any]:
    """Raise the refusal :func:`~changelake.service.query_start.start_query` would raise for the checkpoint against
    the lake and the views (``service.lifecycle``; ``RestartRefused``, ``RebuildRefused``), without Spark: from
    the config, the checkpoint's files and the Delta logs (delta-rs). Nothing is written or moved; the start
    itself checks again, after the session is built, and records the checkpoint. ``parts``: of ``split``.
    Returns each query's ``Start`` (``service.lifecycle``), in start order: the start takes the positions it read
    and its sinks the delta-rs handles it loaded, instead of reading every table's log again (on an object store,
    a request or more per table and commit)."""
    from changelake.service.lifecycle import prepare
    from changelake.service.views import pipeline_from_config
    from changelake.spark.compile import DEFAULT_BUCKETS

    if parts is None:
        runs = [(config, True, "", None)]
    else:       # the queries in the order start_query starts them, each writing its own tables
        graph_tables = {t.name for t in parts.graph.tables}
        runs = [(parts.graph, True, "", lambda name: name in graph_tables),
                (parts.mirrors, False, MIRRORS_APP, lambda name: name not in graph_tables)]
    found = []
    for run_cfg, with_graph, query, writes in runs:
        graph = pipeline_from_config(run_cfg) if with_graph else None     # as BatchProcessor plans it
        found.append(prepare(run_cfg, graph.plan() if graph is not None else None,
                             buckets=BatchProcessor.DEFAULT_BUCKETS, default_buckets=DEFAULT_BUCKETS,
                             rebuild_views=rebuild_views, writes=writes, app_suffix=query, check_only=True))
    return found


def _await(queries: list[Any], stopping: Callable[[], bool], tick: Callable[[], None]) -> None:
    """Until every query ends: on a stop request each query stops between its batches; when one query fails,
    the others stop too and its error is raised (a pipeline of two queries runs or stops as one). ``tick``
    runs about every half second meanwhile."""
    running = list(queries)
    while running:
        tick()
        for q in list(running):
            if not q.isActive:
                running.remove(q)
                if q.exception() is not None:
                    for other in running:
                        other.stop()
                    q.awaitTermination()        # re-raises the query's error
            elif stopping() and not q.status.get("isTriggerActive", False):
                q.stop()
                running.remove(q)
        if running:
            running[0].awaitTermination(0.5)
    for q in queries:
        q.awaitTermination()     # re-raises a query's error, if one failed


def _totals(processors: list[BatchProcessor]) -> BatchReport:
    """The run's totals over the pipeline's queries (a mirrors' query and a graph's: disjoint tables)."""
    if len(processors) == 1:
        return processors[0].totals
    out = BatchReport(batch_id=processors[0].totals.batch_id)
    for p in processors:
        t = p.totals
        out.records = max(out.records, t.records)       # both read the shared sources: not a sum
        out.expired = max(out.expired, t.expired)
        out.changes.update(t.changes)
        for field_name in ("dead_letters", "key_changes", "truncates"):
            acc = getattr(out, field_name)
            for k, n in getattr(t, field_name).items():
                acc[k] = acc.get(k, 0) + n
    return out


class _CatchUpLine:
    """The per-source catch-up progress (changelake.service.catchup): on a terminal, the status line of a
    :class:`~changelake.service.logs.TerminalStderr` (redrawn in place; every line written to stderr, the
    Spark JVM's and its workers' included, is printed above it, never onto its end); without a terminal
    (``terminal=None``) a log line every ``LOG_EVERY_S`` seconds while records remain, and one when caught up."""

    LOG_EVERY_S = 30.0

    def __init__(self, config: ChangelakeConfig, terminal: Any = None, *, clock: Any = time.monotonic) -> None:
        routes = [(s.name, set(s.topics or ()), re.compile(s.topic_pattern) if s.topic_pattern else None)
                  for s in config.sources]

        def source_of(topic: str) -> str | None:
            return next((n for n, topics, rx in routes if topic in topics or (rx and rx.fullmatch(topic))), None)

        self.tracker = CatchUpTracker(source_of, clock=clock)
        self.terminal = terminal        # show(line) / end(): a TerminalStderr
        self.clock = clock
        self._logged_at: float | None = None
        self._caught_up_logged = False

    @classmethod
    def for_run(cls, config: ChangelakeConfig) -> "_CatchUpLine":
        """Call it before the Spark session starts: the JVM inherits standard error when it starts."""
        on_terminal = TerminalStderr._active is not None or sys.stderr.isatty()
        return cls(config, TerminalStderr.install() if on_terminal else None)

    def show(self, progress: dict[str, Any]) -> None:
        sources = self.tracker.observe(progress)
        line = format_progress_line(sources)
        if not line:
            return
        if self.terminal is not None:
            self.terminal.show(line)
            return
        now = self.clock()
        left = sum(s.remaining for s in sources)
        if left == 0:
            if not self._caught_up_logged:
                log.info("caught up: %s", line)
            self._caught_up_logged = True
            return
        self._caught_up_logged = False
        if self._logged_at is None or now - self._logged_at >= self.LOG_EVERY_S:
            self._logged_at = now
            log.info("catching up: %s", line)

    def end(self) -> None:
        if self.terminal is not None:
            self.terminal.end()


def wait_for(predicate: Any, *, timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
