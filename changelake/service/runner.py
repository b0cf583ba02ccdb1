"""Runs one pipeline: Spark session, HTTP endpoint, progress listener, query, graceful stop."""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from changelake import metrics
from changelake.service.catchup import CatchUpTracker, format_progress_line
from changelake.service.config import ChangelakeConfig, parse_duration
from changelake.service.http import Health, HttpEndpoint
from changelake.service.logs import log_format
from changelake.service.pipeline import BatchProcessor, BatchReport, start_query
from changelake.service.preflight import broker_topics, side_topic, skipped_side_topics
from changelake.service.restart_clock import RestartClock
from changelake.spark.progress import ProgressListener, parse_offsets
from changelake.spark.session import build_session, driver_jvm, executor_tasks

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
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        topics = broker_topics(cfg)     # an unreachable broker: one line (SourceError) within seconds, before Spark
        for topic, source in skipped_side_topics(cfg, topics).items():
            metrics.TOPICS_SKIPPED.labels(topic, side_topic(topic) or "").set(1)
            log.info("source %s: topic_pattern matches %s, a Debezium %s topic: not read (no row changes; "
                     "docs/pipelines.md, 'Topic patterns')", source, topic, side_topic(topic))
        if self.serve_http:
            self.endpoint = HttpEndpoint(self.health, host=cfg.metrics.host, port=cfg.metrics.port).start()
            log.info("metrics and health on %s", self.endpoint.url("/"))
        conf = dict(cfg.pipeline.spark_conf)
        if log_format() == "json":      # Spark's log4j lines as JSON objects too (changelake.service.logs)
            conf.setdefault("spark.log.structuredLogging.enabled", "true")
        spark = self._spark or build_session(app_name=f"changelake-{cfg.pipeline.id}", master=cfg.pipeline.master,
                                            conf=conf)
        clock = RestartClock()
        clock.mark("session")
        metrics.JVM.watch(*driver_jvm(spark))
        terminal = _CatchUpLine.for_run(cfg)
        listener = ProgressListener(self.health, on_progress=terminal.show)
        spark.streams.addListener(listener)
        processor = BatchProcessor(cfg, spark=spark)
        processor.clock = clock
        self.processor = processor
        started = time.monotonic()
        query = start_query(spark, cfg, processor, available_now=available_now, rebuild_views=rebuild_views)
        clock.mark("query")
        self.health.query_active = lambda: query.isActive
        self.health.trigger_active = lambda: bool(query.status.get("isTriggerActive", False))
        try:
            while query.isActive:
                if self._stop.is_set() and not query.status.get("isTriggerActive", False):
                    query.stop()
                    break
                query.awaitTermination(0.5)
            query.awaitTermination()     # re-raises the query's error, if it failed
        finally:
            seconds = time.monotonic() - started
            listener.on_progress = None
            terminal.end()
            # Progress events reach the listener asynchronously, the last batch's maybe after the end: every
            # batch's report is recorded here, before /metrics stops, so its final figures count every batch.
            for report in query.recentProgress:
                listener.record_progress(report)
            spark.streams.removeListener(listener)
            if self.endpoint is not None and not self.serve_http_after_stop:
                self.endpoint.stop()
        last = query.lastProgress
        end_offsets = {}
        if last:
            end_offsets = parse_offsets(last["sources"][0].get("endOffset")) if last.get("sources") else {}
        executors = executor_tasks(spark)
        if executors:
            log.info("ran on %d executor(s): %s", len(executors),
                     ", ".join(f"executor {e}: {n} task(s)" for e, n in sorted(executors.items())))
        return RunResult(totals=processor.totals, lag=dict(listener.last_lag), end_offsets=end_offsets,
                         progress=list(query.recentProgress),
                         metrics_url=self.endpoint.url() if self.endpoint else None,
                         stopped_by_signal=self._stop.is_set(), seconds=seconds, executors=executors)

    #: keep the endpoint up after the query ends (the demo prints the URL and lets you scrape it)
    serve_http_after_stop = False


class _CatchUpLine:
    """The per-source catch-up progress (changelake.service.catchup): a ``\\r``-overwritten line on a terminal's
    stderr, which log lines clear before they print and which is drawn again after them; without a terminal
    (``stream=None``) a log line every ``LOG_EVERY_S`` seconds while records remain, and one when caught up."""

    LOG_EVERY_S = 30.0

    def __init__(self, config: ChangelakeConfig, stream: Any = None, *, clock: Any = time.monotonic) -> None:
        routes = [(s.name, set(s.topics or ()), re.compile(s.topic_pattern) if s.topic_pattern else None)
                  for s in config.sources]

        def source_of(topic: str) -> str | None:
            return next((n for n, topics, rx in routes if topic in topics or (rx and rx.fullmatch(topic))), None)

        self.tracker = CatchUpTracker(source_of, clock=clock)
        self.stream = stream
        self.clock = clock
        self.line = ""
        self._logged_at: float | None = None
        self._caught_up_logged = False
        self._handlers: list[tuple[logging.StreamHandler, Any]] = []
        if stream is not None:          # log lines go around the progress line, not onto its end
            for h in logging.getLogger().handlers:
                if getattr(h, "_changelake", False) and isinstance(h, logging.StreamHandler):
                    self._handlers.append((h, h.stream))
                    h.setStream(_AroundLine(h.stream, self))

    @classmethod
    def for_run(cls, config: ChangelakeConfig) -> "_CatchUpLine":
        return cls(config, sys.stderr if sys.stderr.isatty() else None)

    def show(self, progress: dict[str, Any]) -> None:
        sources = self.tracker.observe(progress)
        line = format_progress_line(sources)
        if not line:
            return
        if self.stream is not None:
            self.line = line
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
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
        for handler, stream in self._handlers:
            handler.setStream(stream)
        if self.stream is not None and self.line:
            self.stream.write("\n")
            self.stream.flush()
        self.line = ""


class _AroundLine:
    """A log handler's stream that clears the progress line before a log line and draws it again after."""

    def __init__(self, stream: Any, progress: _CatchUpLine) -> None:
        self._stream, self._progress = stream, progress

    def write(self, text: str) -> int:
        if self._progress.line:
            self._stream.write("\r\x1b[K")
        n = self._stream.write(text)
        if self._progress.line and text.endswith("\n"):
            self._stream.write(self._progress.line)
        return n

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def wait_for(predicate: Any, *, timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
