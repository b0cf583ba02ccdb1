"""The Spark session changelake runs in, and which Spark settings take effect.

A setting comes from one of three places; the first that sets a key wins:

==================  ==================================================================================
1. the launcher     ``spark-submit --master/--conf`` (the chart's SparkApplication), ``spark-defaults.conf``
                    in ``SPARK_CONF_DIR`` (the chart's StatefulSet), ``PYSPARK_SUBMIT_ARGS``, and
                    ``SPARK_DRIVER_MEMORY`` (for ``spark.driver.memory``)
2. the pipeline     ``pipeline.master`` and ``pipeline.spark_conf`` of the YAML
3. code defaults    :data:`DEFAULTS`, ``local[2]``, one shuffle partition per core of the master, and
                    the driver JVM's options (:func:`driver_java_options`: the class archive; on a
                    local master the parallel collector), each unless the user's JVM options choose it;
                    on a local master, Spark's Python processes forked by a warm server
                    (changelake/spark/fork_server.py; ``CHANGELAKE_FORK_SERVER=off`` turns it off);
                    the JVM and workers it starts get ``MALLOC_ARENA_MAX=2`` (:data:`MALLOC_ARENAS`)
                    and the workers and the driver Arrow's buffers from glibc's allocator
                    (:data:`ARROW_POOL`), each unless the environment sets it; and on a local master
                    the JVM's local directories (``SPARK_LOCAL_DIRS``) and temporary directory in a
                    directory of this process,
                    deleted by a later start once this process is gone (changelake/spark/scratch.py),
                    unless the user chose them
==================  ==================================================================================

A YAML setting that the launcher overrides is logged as a warning, so that nobody wonders why it
did not apply. Under spark-submit the JVM already runs with the launcher's settings; otherwise they
are read from the same files and variables Spark's launcher reads, and only settings from 2 and 3
that the launcher does not set are passed to it.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from changelake.spark import fork_server, jvm_archive, jvm_options, scratch, worker_python

log = logging.getLogger(__name__)


DEFAULT_MASTER = "local[2]"

#: Settings the code chooses when nobody else does (see the module docstring).
DEFAULTS: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # A micro-batch's decoded rows are collected on the driver: 1 GB (Spark's default) is too small
    # for 250k-record batches.
    "spark.driver.memory": "2g",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    # Python workers connect back to the JVM; on a loaded 2-core machine 15 s (the default) is not enough
    "spark.python.authenticate.socketTimeout": "120s",
    # pyspark's daemon, importing pyspark from the installed package rather than Spark's zip, which
    # Python compiles again in every worker process (changelake/spark/worker_python.py)
    "spark.python.daemon.module": "changelake.spark.worker_python",
}


#: glibc's malloc arenas in the processes a session starts here (the driver JVM, the Python workers), unless the
#: environment sets the variable: glibc gives a thread that finds the arenas busy one of its own, up to 8 per core,
#: and the JVM's task, RocksDB and network threads filled them with memory it does not give back. Capped at 2, a
#: soak's driver JVM held ~470 MB less at 5,000 events/s (docs/benchmarks.md, "glibc's malloc arenas").
MALLOC_ARENAS = ("MALLOC_ARENA_MAX", "2")

#: the allocator of Arrow's buffers in the processes a session starts here (the Python workers) and in the driver,
#: unless the environment sets the variable: pyarrow's default, mimalloc, kept the pages of a read task's decoded
#: chunks after the chunk was gone, so a read worker held 230-280 MB at its peak against 160-185 MB with glibc's
#: allocator (capped arenas, above); ``bench/operators.py`` peak PSS (a) 1,358 against 1,542-1,554 MB, (b) 1,559-1,580
#: against 1,726-1,728 MB, in the same time (docs/benchmarks.md, "Arrow's buffers from glibc's allocator, and a smaller
#: start of the JVM's heap")
ARROW_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")


@dataclass(frozen=True)
class SessionSettings:
    """What :func:`build_session` gives Spark: the master and the settings passed to the builder
    (those the launcher already set are left out: they are in effect anyway)."""

    master: str
    conf: Mapping[str, str]
    #: YAML keys the launcher overrode: key -> (YAML value, launcher value)
    overridden: Mapping[str, tuple[str, str]]


def session_settings(*, master: str | None, conf: Mapping[str, str] | None,
                     launcher: Mapping[str, str]) -> SessionSettings:
    """Resolve the precedence of the module docstring. ``master``/``conf`` are the pipeline's
    (``None`` master: not set), ``launcher`` the settings of spark-submit, spark-defaults and the
    environment (:func:`launcher_settings`)."""
    mine = dict(conf or {})
    if master is not None:
        mine["spark.master"] = master
    overridden = {k: (v, launcher[k]) for k, v in mine.items() if k in launcher and launcher[k] != v}
    chosen = {k: v for k, v in mine.items() if k not in launcher}
    effective_master = launcher.get("spark.master") or chosen.get("spark.master") or DEFAULT_MASTER
    for key, value in DEFAULTS.items():
        if key not in launcher and key not in chosen:
            chosen[key] = value
    # Every stateful operator runs one task per shuffle partition per micro-batch, and each task starts
    # its Python runners: on local[N], N partitions (one wave of tasks) halved the demo graph's time per
    # batch of 1,000 records against 4 on 2 cores (bench/batch_latency.py). A checkpoint keeps the count
    # it was created with.
    key = "spark.sql.shuffle.partitions"
    if key not in launcher and key not in chosen:
        chosen[key] = str(master_cores(effective_master) or 4)
    chosen.pop("spark.master", None)
    return SessionSettings(master=effective_master, conf=chosen, overridden=overridden)


def launcher_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings given outside the pipeline YAML.

    Under spark-submit (``PYSPARK_GATEWAY_PORT`` set) they are the running JVM's ``spark.*``
    properties. Otherwise they are what Spark's launcher will read when the session starts:
    ``spark-defaults.conf`` (in ``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``), then
    ``PYSPARK_SUBMIT_ARGS`` (``--master``, ``--conf k=v``, ``--driver-memory``), with
    ``SPARK_DRIVER_MEMORY`` where neither sets ``spark.driver.memory``.
    """
    environ = os.environ if environ is None else environ
    if environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()        # connects to spark-submit's JVM; starts nothing
        return {k: v for k, v in SparkConf().getAll()}
    out: dict[str, str] = {}
    conf_dir = environ.get("SPARK_CONF_DIR") or (
        os.path.join(environ["SPARK_HOME"], "conf") if environ.get("SPARK_HOME") else None)
    if conf_dir:
        out.update(read_spark_defaults(Path(conf_dir) / "spark-defaults.conf"))
    out.update(submit_args_settings(environ.get("PYSPARK_SUBMIT_ARGS", "")))
    if "spark.driver.memory" not in out and environ.get("SPARK_DRIVER_MEMORY"):
        out["spark.driver.memory"] = environ["SPARK_DRIVER_MEMORY"]
    return out


_PROPERTY = re.compile(r"^(\S+?)\s*[=:\s]\s*(.*)$")


def read_spark_defaults(path: Path) -> dict[str, str]:
    """``spark-defaults.conf``: one ``key value`` (or ``key=value``) a line, ``#`` comments."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            m = _PROPERTY.match(line)
            key, value = (m.group(1), m.group(2).strip()) if m else (line, "")
            out[key] = value
    return out


_SUBMIT_FLAGS = {"--master": "spark.master", "--driver-memory": "spark.driver.memory",
                 "--executor-memory": "spark.executor.memory", "--executor-cores": "spark.executor.cores",
                 "--num-executors": "spark.executor.instances"}


def submit_args_settings(args: str) -> dict[str, str]:
    """The settings in spark-submit arguments (``PYSPARK_SUBMIT_ARGS``): ``--conf k=v``, ``--master X``,
    ``--driver-memory X``, ... (also as ``--flag=X``)."""
    words = shlex.split(args)
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        flag, eq, value = words[i].partition("=") if words[i].startswith("--") else (words[i], "", "")
        known = flag in ("--conf", "-c") or flag in _SUBMIT_FLAGS
        if known and not eq and i + 1 < len(words):
            value = words[i + 1]
            i += 1
        if flag in ("--conf", "-c"):
            key, sep, val = value.partition("=")
            if sep:
                out[key] = val
        elif flag in _SUBMIT_FLAGS:
            out[_SUBMIT_FLAGS[flag]] = value
        i += 1
    return out


def delta_settings(engine: str, launcher: Mapping[str, str], chosen: Mapping[str, str],
                   master: str = DEFAULT_MASTER) -> dict[str, str]:
    """The settings that give a new session delta-spark (none for ``engine`` delta-rs):

    ===================================  ===========================================================
    ``spark.jars``                       the ``delta`` JVM set's jars (changelake/spark/delta_jars.py),
                                         after any the launcher or the pipeline give: Spark puts them on
                                         the driver's class path and ships them to the executors (local,
                                         local-cluster and cluster masters alike; no Ivy, no
                                         ``--packages``). Not when Spark's own ``jars`` directory holds
                                         delta-spark, nor under spark-submit (pass ``--jars`` there)
    ``spark.sql.extensions``,            Delta's SQL extension and catalog, when delta-spark's jars are
    ``spark.sql.catalog.spark_catalog``  there (unless set otherwise)
    ``spark.databricks.delta.``          on a local master, its task slots (Delta's default, 50 tasks
    ``snapshotPartitions``               per table state read, takes seconds of empty tasks on 2 cores)
    ===================================  ===========================================================

    ``engine`` is ``storage.engine``: auto and delta-spark both load the jars when they are installed
    (auto still writes with delta-rs on a local master: changelake/spark/delta_sink.py, ``open_sink``).
    """
    from changelake.spark.delta_jars import session_jars, spark_home_jars

    if engine == "delta-rs":
        return {}
    out: dict[str, str] = {}
    under_submit = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    jars = [] if under_submit else session_jars()
    if jars:
        given = [j for src in (launcher, chosen) for j in src.get("spark.jars", "").split(",") if j]
        out["spark.jars"] = ",".join(dict.fromkeys(given + jars))
    on_classpath = bool(jars or spark_home_jars()) or "delta-spark" in launcher.get("spark.jars", "")
    if on_classpath:
        for key, value in (("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"),
                           ("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")):
            if key not in launcher and key not in chosen:
                out[key] = value
        key, cores = "spark.databricks.delta.snapshotPartitions", master_cores(master)
        if cores and master.startswith("local") and key not in launcher and key not in chosen:
            out[key] = str(cores)
    return out


def jar_set_settings(names: Sequence[str], launcher: Mapping[str, str], chosen: Mapping[str, str]) -> dict[str, str]:
    """``spark.jars`` with the jars of the project's JVM sets ``names`` (changelake/jvm_deps.py) after those the
    launcher or the pipeline give: Spark puts them on the driver's class path and ships them to the executors
    (local, local-cluster and cluster masters alike), never fetched at run time (no ``--packages``). Nothing
    under spark-submit, whose JVM already runs (the chart's SparkApplication lists them itself). A set that is
    not installed raises ``JvmDepsMissing``, which says how to install it."""
    if not names or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return {}
    from changelake import jvm_deps

    given = [j for src in (launcher, chosen) for j in src.get("spark.jars", "").split(",") if j]
    mine = [str(p) for name in names for p in jvm_deps.jars(name)]
    return {"spark.jars": ",".join(dict.fromkeys(given + mine))}


def build_session(*, app_name: str = "changelake", master: str | None = None,
                  conf: Mapping[str, str] | None = None, ui: bool = True,
                  launcher: Mapping[str, str] | None = None, engine: str = "auto",
                  jar_sets: Sequence[str] = ()) -> SparkSession:
    """A Spark session for one pipeline, with the settings of the module docstring's precedence.

    Python workers use this interpreter (through ``changelake-worker-python`` where it is installed beside
    it: changelake/spark/worker_python.py); ``engine`` (``storage.engine``) other than delta-rs puts the
    delta-spark jars on the class path when they are installed, with Delta's SQL extension
    (:func:`delta_settings`). ``jar_sets``: JVM sets whose jars go on ``spark.jars`` (:func:`jar_set_settings`;
    ``spark-kafka`` for ``kafka.reader: spark-kafka``).
    """
    launcher = launcher_settings() if launcher is None else launcher
    settings = session_settings(master=master, conf=conf, launcher=launcher)
    for key, (mine, theirs) in sorted(settings.overridden.items()):
        log.warning("the pipeline's %s=%s does not apply: the Spark launcher (spark-submit, spark-defaults.conf "
                    "or the environment) sets %s; remove one of the two", key, mine, theirs)
    # Spark's Python processes run this interpreter (so they see the same packages), through the script
    # that imports pyspark from the installed package (changelake/spark/worker_python.py) where installed; the JVM's
    # own Python calls too (the lookup of Python data sources at the first query runs PYSPARK_DRIVER_PYTHON)
    script = worker_python.script_path()
    starts_jvm = _starts_a_jvm()
    if starts_jvm:
        # the driver JVM and the Python workers it starts inherit this process's environment
        os.environ.setdefault(*MALLOC_ARENAS)
        if ARROW_POOL[0] not in os.environ:
            os.environ[ARROW_POOL[0]] = ARROW_POOL[1]
            # this process's pyarrow chose its pool when first used, before the variable was set
            pa.set_memory_pool(pa.system_memory_pool())
    os.environ.setdefault("PYSPARK_PYTHON", script or sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", script or sys.executable)
    # Spark's Python processes as forks of a warm process (changelake/spark/fork_server.py), on a local master
    served = (fork_server.start() if script and os.environ["PYSPARK_PYTHON"] == script and local_master(settings.master)
              and _no_context() else None)
    local = local_master(settings.master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder: Any = SparkSession.builder.appName(app_name)
    if "spark.master" not in launcher:
        builder = builder.master(settings.master)
    chosen = dict(settings.conf)
    if os.environ.get("PYSPARK_GATEWAY_PORT") and "spark.driver.memory" in chosen:
        # under spark-submit the driver JVM already runs: its heap can no longer change
        if "spark.driver.memory" in (conf or {}):
            log.warning("the pipeline's spark.driver.memory=%s does not apply under spark-submit (the driver JVM "
                        "is already running); pass --driver-memory or spark.driver.memory to spark-submit",
                        chosen["spark.driver.memory"])
        del chosen["spark.driver.memory"]
    if not ui:
        chosen["spark.ui.enabled"] = "false"
    if local:
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            if key not in launcher:
                chosen.setdefault(key, "127.0.0.1")
    # scratch files where a killed session's can be found and deleted (changelake/spark/scratch.py); given to the
    # JVM as SPARK_LOCAL_DIRS, which a local driver reads before spark.local.dir (set as spark.local.dir, Spark warns
    # at every start that a cluster manager's value would override it), in the JVM's environment only
    own_dir = None
    if (local and starts_jvm and "spark.local.dir" not in launcher and "spark.local.dir" not in chosen
            and not os.environ.get("SPARK_LOCAL_DIRS")):
        own_dir = scratch.session_dir()
    if _JAVA_OPTIONS not in launcher and _JAVA_OPTIONS not in chosen and starts_jvm:
        options = driver_java_options(settings.master, launcher.get("spark.driver.extraJavaOptions", ""),
                                      chosen.get("spark.driver.extraJavaOptions", ""), tmpdir=own_dir, engine=engine)
        if options:
            chosen[_JAVA_OPTIONS] = options
    if served and not starts_jvm:
        # under spark-submit the driver JVM already runs without the server's variable in its environment; the
        # Python processes it starts get the session's executor environment (pyspark passes it with every function)
        chosen[f"spark.executorEnv.{fork_server.ENV}"] = served
    chosen.update(jar_set_settings(jar_sets, launcher, chosen))      # before delta's: it keeps spark.jars chosen
    chosen.update(delta_settings(engine, launcher, chosen, settings.master))
    for key, value in chosen.items():
        builder = builder.config(key, value)
    if own_dir is None:
        spark = builder.getOrCreate()
    else:
        os.environ["SPARK_LOCAL_DIRS"] = str(own_dir)        # the JVM started here inherits it; nothing else does
        try:
            spark = builder.getOrCreate()
        finally:
            del os.environ["SPARK_LOCAL_DIRS"]
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: the driver JVM's options that Spark's launcher puts before ``spark.driver.extraJavaOptions``
_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"


def driver_java_options(master: str, *given: str, tmpdir: Path | None = None, engine: str = "auto") -> str | None:
    """The options of a driver JVM this process starts for ``master`` (``given``: the
    ``spark.driver.extraJavaOptions`` in effect): Spark's classes from the archive
    (changelake/spark/jvm_archive.py), on a local master the parallel collector and the first-tier JIT (not with
    ``engine`` delta-spark: changelake/spark/jvm_options.py), and ``tmpdir`` as the JVM's temporary directory (the
    native libraries it unpacks: changelake/spark/scratch.py), each unless the user's options choose it; None:
    none of them."""
    parts = [jvm_archive.java_options(*given), jvm_options.collector(master, *given),
             jvm_options.jit(master, *given, engine=engine)]
    if tmpdir is not None and not any("-Djava.io.tmpdir=" in g for g in given):
        parts.append(shlex.quote(f"-Djava.io.tmpdir={tmpdir}"))
    return " ".join(p for p in parts if p) or None


def local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local-cluster[...]``: every process of the session runs on this machine."""
    return master.startswith("local")


def _starts_a_jvm() -> bool:
    """True when ``getOrCreate`` will launch the driver JVM: not under spark-submit, no session running."""
    return not os.environ.get("PYSPARK_GATEWAY_PORT") and _no_context()


def _no_context() -> bool:
    """True while no Spark context runs in this process: ``getOrCreate`` makes it with this process's settings
    (under spark-submit as well, where the driver JVM already runs)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is None


def master_cores(master: str) -> int | None:
    """The task slots of a ``local[N]`` / ``local[*]`` / ``local`` / ``local-cluster[N,C,M]`` master
    (None for a cluster manager, whose executors are not known before they register)."""
    if master == "local":
        return 1
    if master.startswith("local-cluster[") and master.endswith("]"):
        parts = master[len("local-cluster["):-1].split(",")
        if len(parts) == 3 and parts[0].strip().isdigit() and parts[1].strip().isdigit():
            return int(parts[0]) * int(parts[1])
        return None
    if master.startswith("local[") and master.endswith("]"):
        n = master[6:-1].split(",")[0]
        if n == "*":
            return os.cpu_count() or 1
        return int(n) if n.isdigit() else None
    return None


def executor_tasks(spark: Any) -> dict[str, int]:
    """Executor id -> tasks it has run (completed or failed), from Spark's status store, for every
    executor that ran one (lost ones included); the driver is left out, so local mode has none."""
    store = spark.sparkContext._jsc.sc().statusStore()
    seq = store.executorList(False)         # executors lost on the way count too
    out = {}
    for i in range(seq.size()):
        e = seq.apply(i)
        tasks = int(e.completedTasks()) + int(e.failedTasks())
        if e.id() != "driver" and tasks:
            out[e.id()] = tasks
    return out


def executor_times(spark: Any) -> dict[str, tuple[float, float, int]]:
    """Executor id (``driver`` for a local master's tasks) -> (seconds its tasks ran, seconds of them in GC,
    shuffle bytes read), from Spark's status store, for every executor that ran a task: where a run's time went
    (bench/scaleout.py compares local[N] with local-cluster by it)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    seq = store.executorList(False)
    out = {}
    for i in range(seq.size()):
        e = seq.apply(i)
        if int(e.completedTasks()) + int(e.failedTasks()):
            out[e.id()] = (int(e.totalDuration()) / 1000, int(e.totalGCTime()) / 1000, int(e.totalShuffleRead()))
    return out


def driver_jvm(spark: Any) -> tuple[int | None, Any]:
    """(pid of the driver JVM this process launched, or None: one it attached to; a callable that returns
    the JVM's heap in bytes: used, committed, max) for ``changelake.metrics.JVM``."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()

    def heap() -> dict[str, int]:
        total, free = int(runtime.totalMemory()), int(runtime.freeMemory())
        return {"heap_used": total - free, "heap_committed": total, "heap_max": int(runtime.maxMemory())}

    return (proc.pid if proc is not None else None), heap
