"""One HTTP port for Prometheus and Kubernetes: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz`` answers 200 while the process serves requests. ``/readyz`` answers
200 only while the streaming query is active and a batch finished within
``ready_after_intervals`` trigger intervals; before the first batch has finished it
is not ready. Otherwise 503 with the reason in the body.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from changelake.metrics import REGISTRY

DEFAULT_PORT = 9108


class Health:
    """What /readyz looks at; the pipeline updates it."""

    def __init__(self, *, max_silence_s: float) -> None:
        self.max_silence_s = max_silence_s
        self.started_at = time.time()
        self.last_batch_at: float | None = None
        self.query_active: Callable[[], bool] = lambda: False

    def batch_finished(self) -> None:
        self.last_batch_at = time.time()

    def ready(self) -> tuple[bool, str]:
        if not self.query_active():
            return False, "the streaming query is not running"
        if self.last_batch_at is None:
            return False, f"no micro-batch has finished yet (started {time.time() - self.started_at:.0f}s ago)"
        silence = time.time() - self.last_batch_at
        if silence > self.max_silence_s:
            return False, f"the last micro-batch finished {silence:.0f}s ago (limit {self.max_silence_s:.0f}s)"
        return True, "ok"


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
        if path == "/readyz":
            ok, why = health.ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [why.encode() + b"\n"]
        if path == "/metrics":
            return metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"changelake serves /metrics, /healthz and /readyz\n"]

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
