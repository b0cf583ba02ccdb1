"""Runs one pipeline: Spark session, HTTP endpoint, progress listener, query, graceful stop."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from changelake.service.config import ChangelakeConfig, parse_duration
from changelake.service.http import Health, HttpEndpoint
from changelake.service.pipeline import BatchProcessor, BatchReport, start_query
from changelake.spark.progress import ProgressListener, parse_offsets
from changelake.spark.session import build_session

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    totals: BatchReport
    lag: dict[tuple[str, str], int]
    end_offsets: dict[str, dict[str, int]]
    progress: list[dict[str, Any]]
    metrics_url: str | None
    stopped_by_signal: bool


class PipelineRunner:
    def __init__(self, config: ChangelakeConfig, *, serve_http: bool = True, spark: Any = None) -> None:
        self.config = config
        self.serve_http = serve_http
        self._spark = spark
        self._stop = threading.Event()
        self.endpoint: HttpEndpoint | None = None
        self.health = Health(max_silence_s=parse_duration(config.pipeline.trigger_interval)
                             * config.metrics.ready_after_intervals + 60)

    def request_stop(self, *_: Any) -> None:
        """Ask for a graceful stop: the running micro-batch finishes, then the query stops."""
        if not self._stop.is_set():
            log.info("stop requested; finishing the current micro-batch")
        self._stop.set()

    def run(self, *, available_now: bool | None = None, install_signal_handlers: bool = True) -> RunResult:
        cfg = self.config
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        if self.serve_http:
            self.endpoint = HttpEndpoint(self.health, host=cfg.metrics.host, port=cfg.metrics.port).start()
            log.info("metrics and health on %s", self.endpoint.url("/"))
        spark = self._spark or build_session(app_name=f"changelake-{cfg.pipeline.id}", master=cfg.pipeline.master,
                                            conf=cfg.pipeline.spark_conf)
        listener = ProgressListener(self.health)
        spark.streams.addListener(listener)
        processor = BatchProcessor(cfg, spark=spark)
        query = start_query(spark, cfg, processor, available_now=available_now)
        self.health.query_active = lambda: query.isActive
        try:
            while query.isActive:
                if self._stop.is_set() and not query.status.get("isTriggerActive", False):
                    query.stop()
                    break
                query.awaitTermination(0.5)
            query.awaitTermination()     # re-raises the query's error, if it failed
        finally:
            spark.streams.removeListener(listener)
            if self.endpoint is not None and not self.serve_http_after_stop:
                self.endpoint.stop()
        # Progress events are delivered asynchronously; the last one may come after the end.
        last = query.lastProgress
        end_offsets = {}
        if last:
            listener.record_progress(last)
            end_offsets = parse_offsets(last["sources"][0].get("endOffset")) if last.get("sources") else {}
        return RunResult(totals=processor.totals, lag=dict(listener.last_lag), end_offsets=end_offsets,
                         progress=list(query.recentProgress),
                         metrics_url=self.endpoint.url() if self.endpoint else None,
                         stopped_by_signal=self._stop.is_set())

    #: keep the endpoint up after the query ends (the demo prints the URL and lets you scrape it)
    serve_http_after_stop = False


def wait_for(predicate: Any, *, timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
