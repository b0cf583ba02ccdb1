"""A fork server for Spark's Python processes: each one a fork of a warm process instead of a new interpreter.

At a (re)start Spark starts some 25 Python processes for the demo's pipeline (the lookup of Python data sources,
the Kafka source's planning and runner, one planning worker per stateful operator, the UDF daemons), each a new
interpreter that imports pyspark, pyarrow, pandas and changelake's modules: 0.4-0.7 CPU seconds each on this
machine, 12-13 of a restart's ~33 (docs/operations.md, "Restart to first commit"). The server imports all that
once, while the driver's JVM starts, and then forks a process for each one Spark asks for.

======================  =================================================================================
who                     does
======================  =================================================================================
the driver              :func:`start` before the JVM starts (``build_session``, local masters only): the
                        server in a child process, its socket path in ``CHANGELAKE_FORK_SERVER``, which
                        the JVM and the processes it starts inherit
``changelake-worker-    :func:`~.worker_python.run_forked`: sends its command (``-m module args``),
python -m ...``         working directory, environment and stdin/stdout/stderr (file descriptors over the
                        Unix socket), then waits for the fork's exit code, passing on SIGTERM/SIGINT/SIGHUP,
                        and exits with it
the server              :func:`serve`: per request, forks; the fork takes the descriptors, directory,
                        environment and ``sys.path`` as ``python -m`` would set them, and runs the module
======================  =================================================================================

A process starts as before (a new interpreter) when ``CHANGELAKE_FORK_SERVER`` is unset or ``off``, the
server does not answer (not yet ready, gone), or the request sets a ``PYTHONHASHSEED`` other than the server's
(a fork keeps its parent's string hashes). The server stops when the driver is gone; a SIGKILL of the pipeline's
process group takes it and its forks with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile

from changelake.spark import worker_python

#: the server's socket path (or ``off``), inherited by the JVM and the Python processes it starts
ENV = worker_python.FORK_SERVER_ENV
#: what the server imports before it serves: what Spark's Python processes import first (the UDF daemon's
#: preload, and the planning and runner processes' own modules)
PRELOAD = ("pyspark.daemon", *worker_python.PRELOAD,
           "pyspark.sql.streaming.python_streaming_source_runner",
           "pyspark.sql.streaming.transform_with_state_driver_worker",
           "pyspark.sql.worker.plan_data_source_read", "pyspark.sql.worker.create_data_source",
           "pyspark.sql.worker.lookup_data_sources")

_server: subprocess.Popen | None = None


def start() -> str | None:
    """Start the server for this process's Spark session (once; ``CHANGELAKE_FORK_SERVER=off`` turns it off) and
    set ``CHANGELAKE_FORK_SERVER``; returns its socket path, or None when off."""
    global _server
    given = os.environ.get(ENV, "")
    if given.lower() in ("off", "false", "0", "none"):
        return None
    if _server is not None and _server.poll() is None:
        return os.environ.get(ENV)
    path = os.path.join(tempfile.mkdtemp(prefix="changelake-fork-"), "server.sock")
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    env.pop(ENV, None)
    _server = subprocess.Popen([sys.executable, "-m", __name__, path, str(os.getpid())], env=env,
                               stdin=subprocess.DEVNULL)
    os.environ[ENV] = path
    return path


def server_pid() -> int | None:
    """The pid of the server this process started, while it runs."""
    return _server.pid if _server is not None and _server.poll() is None else None


def serve(path: str, parent: int | None = None) -> None:
    """Import :data:`PRELOAD`, listen on ``path`` and fork a process per request until ``parent`` (the driver's
    pid; default: this process's parent when it starts) is gone. A driver that dies while this server is still
    importing (a refused start, a SIGKILL during Spark's start) ends it too: the parent is known before the
    imports, not looked up after them, when this process would already belong to init."""
    parent = os.getppid() if parent is None else parent
    worker_python._drop_redundant_zips()
    worker_python.preload(PRELOAD)
    worker_python.freeze()                   # the forks' collections leave the preloaded objects alone
    base = sys.path[1:]                      # the interpreter's own path: stdlib, site-packages
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in base if p not in own]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)           # forks are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)                          # answers from now on
    listener.settimeout(1.0)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except (socket.timeout, InterruptedError):
            continue
        try:
            conn.settimeout(30)
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            size = struct.unpack("!Q", _read(conn, 8))[0]
            request = json.loads(_read(conn, size))
            conn.settimeout(None)
        except (OSError, ValueError, struct.error):
            conn.close()
            continue
        seed = request["env"].get("PYTHONHASHSEED")      # unset: any seed will do, as in a new interpreter
        if (seed is not None and seed != os.environ.get("PYTHONHASHSEED")) or len(fds) != 3:
            conn.sendall(b"refused\n")
        elif os.fork() == 0:
            listener.close()
            _become(conn, fds, request, base)               # never returns
        conn.close()
        for fd in fds:
            os.close(fd)
    for done in (lambda: os.unlink(path), lambda: os.rmdir(os.path.dirname(path))):
        try:
            done()
        except OSError:
            pass


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("the client went away")
        data += chunk
    return data


def _become(conn: socket.socket, fds: list[int], request: dict, base: list[str]) -> None:
    """In the fork: the client's descriptors, directory, environment and ``python -m`` path, then the module."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        extra = [p for p in extra if p not in set(worker_python.redundant_zips(extra))]
        sys.path[:] = [os.getcwd(), *dict.fromkeys(extra + base)]
        module, *args = request["argv"]
        sys.argv = [module, *args]
        conn.sendall(f"{os.getpid()}\n".encode())
        import runpy

        code = 0
        try:
            if module == worker_python.__name__:
                worker_python.daemon_main()
            else:       # the server imported it (PRELOAD): run its code again as __main__, as python -m would
                sys.modules.pop(module, None)
                if module in worker_python.CHATTY_MODULES:
                    sys.stdout = open(os.devnull, "w")
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - as an interpreter would: the traceback on stderr, exit code 1
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
                pass
        try:
            conn.sendall(f"{code}\n".encode())
        except OSError:
            pass
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
