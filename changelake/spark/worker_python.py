"""How Spark starts its Python processes here: pyspark imported from the installed package.

Spark puts ``SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on the ``PYTHONPATH``
of every Python process it starts (the UDF workers' daemon, the Python data source's and
``transformWithState``'s planning workers, the streaming source's runner). Python cannot cache the
compiled modules of a zip, so each of these processes compiles pyspark's modules from source
again: 0.7 s per process against 0.16 s from the installed package on this machine. With pip's
layout (``SPARK_HOME`` = the installed ``pyspark`` package) the zips hold the same modules as the
packages beside them, which Python caches as ``.pyc``; so they are taken off ``sys.path`` before
pyspark is imported. Any other layout (a Spark distribution's own ``SPARK_HOME``) is left as it is.

Where the driver started a fork server (``changelake.spark.fork_server``), ``changelake-worker-python -m ...``
has it fork the process instead, warm, and starts an interpreter only when the server cannot serve.

Two ways in, both set by ``changelake.spark.session``:

* ``changelake-worker-python``, the interpreter Spark starts its Python processes with
  (``PYSPARK_PYTHON``, where nobody else chose one): ``-m module args`` runs ``module`` as
  ``python -m`` would, after the path is set; any other command line is handed to this Python.
* ``spark.python.daemon.module = changelake.spark.worker_python``: pyspark's UDF daemon behind the
  same path fix, for launchers that choose ``PYSPARK_PYTHON`` themselves (the container image).

Neither may import pyspark, or anything of changelake that does, before the path is set.

A daemon forks its workers: what it imported before the fork, they start with. pyspark's own daemon imports
nothing a worker needs, so every UDF worker imported pyspark's worker, pyarrow, pandas and changelake's
modules on its own (0.5-0.7 s of CPU each on this machine; a restart's first batch forks four or more).
The UDF daemon here imports :data:`PRELOAD` first (:func:`preload`), once. pyspark's daemon forks before
importing the worker module because pandas and pyarrow start threads at import (OpenBLAS's pool, jemalloc's
background thread); both reset them in a forked child (their ``pthread_atfork`` handlers), as deltalake's
jemalloc does its own, and changelake's modules start none at import. A library that starts threads a fork
does not reset (polars' pool) stays out of :data:`PRELOAD`. A module that fails to import is left to the
worker, which then reports the error as before.

What was imported before a fork is then frozen (:func:`freeze`, ``gc.freeze()``): the collector leaves those objects
alone for good. pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every task; without the
freeze that pass walks every preloaded object (~87,000: 40-75 ms a pass) and writes to each one's header, which
copies the pages the fork shares with its parent (~25 MB of a worker's memory made its own, for nothing).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import sys

#: the fork server's socket path (or ``off``; ``changelake.spark.fork_server``), inherited by the JVM and the
#: Python processes it starts
FORK_SERVER_ENV = "CHANGELAKE_FORK_SERVER"

#: the console script of :func:`interpreter_main` (pyproject.toml)
SCRIPT = "changelake-worker-python"

_PY4J_ZIP = re.compile(r"py4j-(?P<version>[0-9][0-9A-Za-z.]*)-src\.zip$")


def redundant_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are Spark's zips of an installed pyspark (and its py4j)."""
    out = []
    for entry in path:
        lib = os.path.dirname(entry)
        if os.path.basename(lib) != "lib" or os.path.basename(os.path.dirname(lib)) != "python":
            continue
        package = os.path.dirname(os.path.dirname(lib))
        if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
            continue            # a Spark distribution's SPARK_HOME: its zips are the only copy
        name = os.path.basename(entry)
        if name == "pyspark.zip":
            out.append(entry)
        elif (m := _PY4J_ZIP.match(name)) and _installed_version("py4j") == m.group("version"):
            out.append(entry)
    return out


def _installed_version(distribution: str) -> str | None:
    # imported here: ``importlib.metadata`` (email, zipfile, pathlib: ~45 ms and ~4 MB) would otherwise be loaded by
    # every ``changelake-worker-python`` process, most of which only pass their request to the fork server
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _drop_redundant_zips() -> None:
    drop = set(redundant_zips(sys.path))
    if drop:
        sys.path[:] = [p for p in sys.path if p not in drop]


#: pyspark modules that print their progress to stdout, which Spark copies to the driver's console: ten
#: lines of "Streaming TransformWithStateInPandas Python worker ..." per stateful operator at every query
#: start, nothing a user needs (their errors go back to the JVM through the worker's socket)
CHATTY_MODULES = frozenset({"pyspark.sql.streaming.transform_with_state_driver_worker"})


def script_path(executable: str | None = None) -> str | None:
    """:data:`SCRIPT` installed beside ``executable`` (default: this interpreter), else None."""
    path = os.path.join(os.path.dirname(executable or sys.executable), SCRIPT)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def interpreter_main(argv: list[str] | None = None) -> None:
    """``changelake-worker-python -m module [args]``: ``python -m module [args]`` with the path set."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])   # not Spark's way of starting a worker: plain Python
    code = run_forked(args[1:])     # a fork of the warm server, where the driver started one
    if code is not None:
        sys.exit(code)
    _drop_redundant_zips()
    sys.path[0] = os.getcwd()            # where ``python -m`` puts the working directory (not the script's)
    sys.argv = [args[1], *args[2:]]
    if args[1] == __name__:             # the daemon module setting, through this script: already imported
        daemon_main()
        return
    import runpy

    if args[1] in CHATTY_MODULES:
        sys.stdout = open(os.devnull, "w")
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


def run_forked(module_args: list[str]) -> int | None:
    """``-m module args`` run by the server as a fork; its exit code, or None when the server cannot serve (then
    the caller starts the module itself)."""
    path = os.environ.get(FORK_SERVER_ENV, "")
    if not path or path.lower() in ("off", "false", "0", "none"):
        return None
    # a SIGTERM between the fork's start and the handlers below would stop this process and leave the fork
    # running: the signals wait, blocked, until the handlers are in place (or until the caller runs the module)
    passed_on = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, passed_on)
    try:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            request = json.dumps({"argv": module_args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
            socket.send_fds(sock, [b"F"], [0, 1, 2])
            sock.sendall(struct.pack("!Q", len(request)) + request)
            reply = sock.makefile("rb")
            first = reply.readline()
        except OSError:
            return None
        if not first.strip().isdigit():         # refused (another hash seed) or gone before forking
            return None
        pid = int(first)

        def forward(signum: int, _frame: object) -> None:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

        for signum in passed_on:
            signal.signal(signum, forward)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        return int(reply.readline())
    except ValueError:                      # no exit code: the fork was killed
        return 1


#: what Spark's UDF workers import: pyspark's worker and Arrow serializers, pyarrow, pandas, and the changelake
#: modules whose functions their tasks run (the Kafka source's reads, the decode stage and its decoders, the
#: stateful chain).
#: ``changelake.service.pipeline`` too: the decode stage a task unpickles holds the pipeline's routes (its
#: ``_Route``, with the config's ``SourceSpec``), so unpickling it imports the pipeline's module and all it
#: imports (the config model, the SQL planner, the Delta sinks): ~0.5 s of CPU in every worker that had not
#: (docs/benchmarks.md, "Spark's Python workers no longer import the pipeline's modules one by one"). And what
#: ``transformWithStateInPandas``'s state client imports on its first call (its protobuf messages, and
#: ``pyspark.testing.utils`` for a flag): another ~0.3 s in each stateful operator's worker
PRELOAD = ("pyspark.worker", "pyspark.sql.pandas.serializers", "pyarrow", "pandas",
           "changelake.spark.kafka_source", "changelake.spark.decode_stage", "changelake.spark.chain",
           "changelake.service.pipeline",
           # the JSON decoders (``make_decoder`` imports each on first use); not Debezium Avro's, whose bulk path
           # imports polars, which starts its thread pool at import: a fork must not inherit that
           *(f"changelake.formats.{m}" for m in ("debezium_json", "canal_json", "maxwell_json", "ogg_json")),
           "pyspark.sql.streaming.stateful_processor_api_client",
           "pyspark.sql.streaming.proto.StateMessage_pb2", "pyspark.testing.utils")


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``modules`` (the daemon, before it forks); returns those that failed, which the workers import
    (and report) themselves."""
    import importlib

    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports the error to Spark
            failed.append(name)
    return failed


def freeze() -> None:
    """Move every object the collector tracks into its permanent generation (``gc.freeze()``), before a fork:
    the forks' collections then neither walk nor write the objects they share with this process."""
    import gc

    gc.collect()
    gc.freeze()


def daemon_main() -> None:
    """``python -m changelake.spark.worker_python <worker module>``: pyspark's daemon with the path set and
    :data:`PRELOAD` imported (and frozen, :func:`freeze`) before it forks its workers."""
    _drop_redundant_zips()
    preload()
    freeze()
    import runpy

    sys.modules.pop("pyspark.daemon", None)     # a fork server's import of it: run as __main__ without a warning
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    daemon_main()
