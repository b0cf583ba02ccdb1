"""One HTTP port for Prometheus and Kubernetes: ``/metrics``, ``/healthz``, ``/livez``, ``/readyz``.

``/healthz`` answers 200 while the process serves requests (the startup probe). ``/livez`` (the
liveness probe) answers 503 when the query is stalled, else 200. Progress is the newest of: a batch
finished, the trigger fired with nothing to read (an idle report), or the running batch's work moved
(records read or written, tasks finished: :attr:`Health.work`, sampled by the runner every few seconds;
a long first batch moves, a hung one does not)::

    query      last progress                       records waiting or batch running   /livez
    not active -                                    -                                  200 (the process exits)
    active     within metrics.stalled_after         -                                  200
    active     longer ago (or never, since start)   no                                 200 (idle: nothing to do)
    active     longer ago (or never, since start)   yes                                503 stalled

``/readyz`` answers 200 only while the streaming query is active and a batch finished within
``ready_after_intervals`` trigger intervals; before the first batch has finished it is not ready.
Otherwise 503 with the reason in the body.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from changelake.metrics import REGISTRY

DEFAULT_PORT = 9108


class Health:
    """What /readyz looks at; the pipeline updates it."""

    def __init__(self, *, max_silence_s: float, stalled_after_s: float = 600.0) -> None:
        self.max_silence_s = max_silence_s
        self.stalled_after_s = stalled_after_s
        self.started_at = time.time()
        self.last_batch_at: float | None = None
        #: records the last progress report left in Kafka (None: no report yet, so unknown: counted as waiting)
        self.records_waiting: int | None = None
        self.query_active: Callable[[], bool] = lambda: False
        self.trigger_active: Callable[[], bool] = lambda: False
        #: what the running jobs have done so far (any value that changes as records are read or written and
        #: tasks finish; None: unknown): sampled by :meth:`sample_work`
        self.work: Callable[[], Hashable | None] = lambda: None
        self.last_work_at: float | None = None
        self._work_seen: Hashable | None = None

    def sample_work(self) -> None:
        """Note the time when the running jobs' work is seen to have moved since the last sample."""
        try:
            seen = self.work()
        except Exception:           # the JVM is going away: the process ends by itself
            return
        if seen is not None and seen != self._work_seen:
            if self._work_seen is not None:
                self.last_work_at = time.time()
            self._work_seen = seen

    def batch_finished(self, progress: dict | None = None) -> None:
        """A batch's progress report (``progress``) or an idle report (None: nothing waiting) came."""
        self.last_batch_at = time.time()
        self.records_waiting = waiting(progress) if progress is not None else 0

    def live(self) -> tuple[bool, str]:
        if not self.query_active():
            return True, "ok (no query running)"
        since = self.last_batch_at if self.last_batch_at is not None else self.started_at
        now = time.time()
        if self.last_work_at is not None and self.last_work_at > since:
            if now - self.last_work_at <= self.stalled_after_s:
                return True, (f"ok (a batch is running: no batch finished for {now - since:.0f}s, its work moved "
                              f"{now - self.last_work_at:.0f}s ago)")
            since = self.last_work_at
        silence = now - since
        if silence <= self.stalled_after_s:
            return True, "ok"
        waiting_now = self.records_waiting is None or self.records_waiting > 0
        try:
            running = bool(self.trigger_active())
        except Exception:           # the JVM is going away: the process ends by itself
            running = False
        if not (waiting_now or running):
            return True, "ok (idle)"
        what = (f"{self.records_waiting:,} records wait in Kafka" if self.records_waiting
                else "a batch is running" if running else "records may wait (no report yet)")
        return False, (f"stalled: no micro-batch has finished and no running one has read or written a record "
                       f"for {silence:.0f}s (metrics.stalled_after {self.stalled_after_s:.0f}s) while {what}")

    def ready(self) -> tuple[bool, str]:
        if not self.query_active():
            return False, "the streaming query is not running"
        if self.last_batch_at is None:
            return False, f"no micro-batch has finished yet (started {time.time() - self.started_at:.0f}s ago)"
        silence = time.time() - self.last_batch_at
        if silence > self.max_silence_s:
            return False, f"the last micro-batch finished {silence:.0f}s ago (limit {self.max_silence_s:.0f}s)"
        return True, "ok"


def waiting(progress: dict) -> int:
    """Records a progress report leaves in Kafka: latest offset minus end offset, summed."""
    import json

    def offsets(value: object) -> dict:
        return (json.loads(value) if isinstance(value, str) else dict(value or {})) or {}

    total = 0
    for source in progress.get("sources", []):
        latest, end = offsets(source.get("latestOffset")), offsets(source.get("endOffset"))
        for topic, parts in latest.items():
            if isinstance(parts, dict):
                for p, high in parts.items():
                    total += max(0, int(high) - int((end.get(topic) or {}).get(p, 0)))
    return total


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


class _ThreadingServer(WSGIServer):
    daemon_threads = True


def _app(health: Health) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/livez":
            ok, why = health.live()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [why.encode() + b"\n"]
        if path == "/readyz":
            ok, why = health.ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [why.encode() + b"\n"]
        if path == "/metrics":
            return metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"changelake serves /metrics, /healthz, /livez and /readyz\n"]

    return app


class HttpEndpoint:
    """Serves the app in a daemon thread; ``port=0`` picks a free port."""

    def __init__(self, health: Health, *, host: str = "0.0.0.0", port: int = DEFAULT_PORT) -> None:
        self._server = make_server(host, port, _app(health), server_class=_ThreadingServer,
                                   handler_class=_QuietHandler)
        self.port = self._server.server_port
        self.host = host
        self._thread = threading.Thread(target=self._server.serve_forever, name="changelake-http", daemon=True)

    def start(self) -> "HttpEndpoint":
        self._thread.start()
        return self

    def url(self, path: str = "/metrics") -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}{path}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
