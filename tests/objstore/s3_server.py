"""An S3 API on this machine for the tests: moto's server mode, and a proxy in front of it that fails requests.

``MotoS3`` runs ``python -m moto.server`` on a free port (``start``, ``ready`` -- a real S3 ListBuckets
round trip --, ``stop``; its log beside the test's tmp dir). ``FaultProxy`` forwards every request to it
and, while a fault is armed, answers the matching requests itself:

    fault            what the client sees                 what the store did
    "refuse"         503 SlowDown                          nothing
    "lose-reply"     500 InternalError                     the request was applied (the reply was lost)

A fault matches a request by method and a substring of its path, for ``times`` requests or until ``until``
(a monotonic time). Every request is counted, so a test can tell that the faults were met. A request that took
longer than ``SLOW_S`` in the proxy is kept in ``slow`` with where its time went (reading the client's request,
moto's answer, writing the reply), so a stall in a soak can be told apart: the test harness or the client.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ACCESS_KEY, SECRET_KEY, REGION = "changelake-test", "changelake-test-secret", "us-east-1"
SLOW_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 server in a child process."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_path = Path(log_dir) / "moto-s3.log"
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MotoS3":
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                      stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self.ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto S3 server did not start; see {self.log_path}")
            time.sleep(0.2)
        return self

    def client(self, endpoint: str | None = None):
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def ready(self) -> bool:
        try:
            self.client().list_buckets()
            return True
        except Exception:  # not listening yet
            return False

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def options(self, endpoint: str | None = None) -> dict[str, str]:
        """The ``storage.options`` a user gives for this store."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}


@dataclass
class Fault:
    kind: str                      # "refuse" | "lose-reply"
    method: str = "PUT"
    path_contains: str = ""
    times: int | None = None       # this many requests, or
    until: float | None = None     # until this monotonic time
    met: int = 0

    def matches(self, method: str, path: str) -> bool:
        if method != self.method or self.path_contains not in path:
            return False
        if self.times is not None:
            return self.met < self.times
        return self.until is not None and time.monotonic() < self.until


class _QuietServer(ThreadingHTTPServer):
    """The proxy's server: a client killed in the middle of a request (a SIGKILLed pipeline) is not an error.

    Its listen backlog is 128, not socketserver's 5: delta-rs opens many connections at once (a MERGE reads
    files in parallel, several tables commit at once), and the kernel dropped every connection beyond the
    backlog that the accept loop had not yet taken; each one's client then waited for TCP's retransmission
    of its SYN (1 s, then 3, 7, 15 s ...). Six Delta logs read by eight threads through the proxy took 32 s
    with a backlog of 5, 3.5 s with 128 (moto directly: 3.0 s).
    """

    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass(frozen=True)
class SlowRequest:
    at: float                      # time.time() when the proxy began reading it
    method: str
    path: str
    read_s: float                  # the client's request, headers to body
    upstream_s: float              # moto's answer
    reply_s: float                 # the reply written back


@dataclass
class FaultProxy:
    """An HTTP proxy in front of ``upstream`` (host:port) that fails the requests a :class:`Fault` matches."""

    upstream_port: int
    faults: list[Fault] = field(default_factory=list)
    requests: int = 0
    slow: list[SlowRequest] = field(default_factory=list)
    #: every request's (method, path) while True
    record: bool = False
    seen: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        proxy = self
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                try:
                    self._proxy()
                except (BrokenPipeError, ConnectionResetError):     # the client gave up on this request
                    self.close_connection = True

            def _proxy(self) -> None:
                began, t0 = time.time(), time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take(self.command, self.path)
                if fault is not None and fault.kind == "refuse":
                    return self._reply(503, b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>")
                t1 = time.monotonic()
                status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
                t2 = time.monotonic()
                try:
                    self._pass_on(fault, status, headers, data)
                finally:
                    t3 = time.monotonic()
                    if t3 - t0 > SLOW_S:
                        proxy._note_slow(SlowRequest(began, self.command, self.path, t1 - t0, t2 - t1, t3 - t2))

            def _pass_on(self, fault, status, headers, data) -> None:
                if fault is not None:      # lose-reply: applied upstream, the client hears an error
                    return self._reply(500, b"<Error><Code>InternalError</Code><Message>injected</Message></Error>")
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = dict((k.lower(), v) for k, v in headers).get("content-length") \
                    if self.command == "HEAD" else None           # a HEAD's length is the object's
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = _QuietServer(("127.0.0.1", free_port()), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.requests += 1
            if self.record:
                self.seen.append((method, path))
            for f in self.faults:
                if f.matches(method, path):
                    f.met += 1
                    return f
        return None

    def _note_slow(self, request: SlowRequest) -> None:
        with self._lock:
            self.slow.append(request)

    def _forward(self, method: str, path: str, headers, body: bytes):
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={k: v for k, v in headers.items()})
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def arm(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def disarm(self) -> None:
        with self._lock:
            self.faults.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
