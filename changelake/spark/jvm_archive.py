"""The Spark JVM's class-data-sharing archive: Spark's classes mapped in at start instead of loaded one by one.

A local session's JVM loads some 20,000 classes from Spark's jars before a query's first results, most of
them once per process: ~2 s of the session's start and more of the first micro-batch on a 2-core machine
(docs/benchmarks.md). The JVM's class-data sharing (CDS, JDK 13+) maps classes a run dumped into an
archive instead. ``changelake jvm-archive`` writes that archive: it runs the demo pipeline on a few
changes in a child process whose JVM dumps every class it loaded on exit (``-XX:ArchiveClassesAtExit``),
and moves the archive into place once that JVM has exited. :func:`build_session
<changelake.spark.session.build_session>` then starts the JVM with it (``-XX:SharedArchiveFile``) when it
starts one.

When it is written: writing it takes a demo run (~40-90 s on 2 cores), which a newcomer's first demo
should not wait for. The Docker image writes it at build time; on a workstation, the first successful
``changelake demo`` or ``changelake run`` starts :func:`write_in_background` (a detached ``changelake
jvm-archive`` with its log beside the archive) when no archive is there, so later starts are faster;
``changelake jvm-archive`` writes it at once.

Where: ``CHANGELAKE_JVM_ARCHIVE`` (a file path; ``off`` turns the archive off), else
``$XDG_CACHE_HOME/changelake`` (``~/.cache/changelake``) under a name derived from the Java and pyspark
in use (:func:`default_path`), so that another JDK or Spark looks for its own. The JVM checks the
archive against its own version and the classpath's jars (paths, sizes, times) and runs without it,
silently (its CDS logging is turned off), where they differ. A missing archive changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from changelake.spark import jvm_options

#: the archive's path, or ``off``
ENV = "CHANGELAKE_JVM_ARCHIVE"
#: set for the child of :func:`write`: where its JVM dumps the archive when it exits
DUMP_ENV = "CHANGELAKE_JVM_ARCHIVE_DUMP"
#: set for the child of :func:`write`: its working directory
CHILD_ENV = "CHANGELAKE_JVM_ARCHIVE_CHILD"
#: the JVM's CDS messages (an archive that does not fit) stay off the pipeline's output
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> str:
    """The java Spark's launcher runs: ``JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java") or "java"
    return os.path.realpath(java) if os.path.exists(java) else java


def default_path() -> Path:
    """``<cache>/changelake/spark-<hash>.jsa``: the hash of the java binary and pyspark's jar directory (its
    path and its jars)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    spark_home = os.environ.get("SPARK_HOME", "")
    # the jars' directory too: the JVM checks the classpath's paths, so each venv gets its own archive
    key = "\n".join([_java(), pyspark.__version__, spark_home, str(jars.resolve()), *names]).encode()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "changelake" / f"spark-{hashlib.sha256(key).hexdigest()[:16]}.jsa"


def archive_path() -> Path | None:
    """Where the archive is or would be (None: turned off with ``CHANGELAKE_JVM_ARCHIVE=off``)."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() in ("off", "false", "0", "none"):
        return None
    return Path(given) if given else default_path()


#: JVM options that choose the class-data sharing themselves
_CDS_OPTION = re.compile(r"(?:^|\s)(-XX:SharedArchiveFile=\S*|-XX:ArchiveClassesAtExit=\S*|-Xshare:\S*|-XX:[+-]AutoCreateSharedArchive)")


def chooses_its_own(*options: str) -> bool:
    """True when JVM options already given (``options``, or the environment's
    :data:`~changelake.spark.jvm_options.OPTION_VARIABLES`) decide the class-data sharing: then changelake
    adds none of its own."""
    return jvm_options.chooses(_CDS_OPTION, *options)


def java_options(*given: str) -> str | None:
    """The JVM options for a new driver JVM: dump the archive (in :func:`write`'s child), map it in (when
    it exists), or None (also where ``given`` options or the environment choose the sharing themselves)."""
    if chooses_its_own(*given):
        return None
    dump = os.environ.get(DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} {QUIET}"
    path = archive_path()
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET}"


def write(command: list[str], path: Path | None = None, *, timeout: float = 900.0) -> Path:
    """Write the archive: ``command`` (a run that starts the session and leaves only once its JVM has
    exited: :func:`stop_jvm`) in a child process whose JVM dumps the classes it loaded on exit, then
    the file moved into place (an existing archive is replaced only by a complete one). Returns the path."""
    path = path or archive_path()
    if path is None:
        raise RuntimeError(f"{ENV}=off: no archive to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="changelake-jvm-archive-") as tmp:
        dump = Path(tmp) / "spark.jsa"
        env = {**os.environ, DUMP_ENV: str(dump), CHILD_ENV: str(Path(tmp) / "work")}
        env.pop(ENV, None)
        for name in jvm_options.OPTION_VARIABLES:          # the run dumps the classes: no other archive of its own
            if name in env:
                env[name] = _CDS_OPTION.sub(" ", env[name]).strip()
        child = subprocess.run(command, env=env, capture_output=True, text=True,
                               timeout=timeout)
        if child.returncode != 0:
            raise RuntimeError(f"the run that writes the JVM archive failed (exit {child.returncode}):\n"
                               f"{child.stdout[-2000:]}{child.stderr[-4000:]}")
        if not dump.is_file() or dump.stat().st_size == 0:
            raise RuntimeError(f"the JVM wrote no archive (is it JDK 13 or later?):\n{child.stderr[-4000:]}")
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        shutil.copyfile(dump, part)
        os.replace(part, path)
    return path


def stop_jvm(timeout: float = 300.0) -> None:
    """Stop the session's JVM and wait until it has exited (it writes a dumped archive as it exits). The
    JVM pyspark launched ends when its standard input closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if proc is None:
        return
    proc.stdin.close()
    proc.wait(timeout=timeout)


def write_in_background(command: list[str]) -> Path | None:
    """Start ``command`` (``changelake jvm-archive``) detached, unless the archive exists, is turned off, or
    another process is writing it (``<archive>.writing`` holds its pid). Returns the log file's path, or None
    when nothing was started."""
    path = archive_path()
    if path is None or path.is_file() or chooses_its_own():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".writing")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        if _alive(lock):
            return None
        lock.unlink(missing_ok=True)            # left by a writer that died
        return write_in_background(command)
    log_path = path.with_name(path.name + ".log")
    with open(log_path, "wb") as log_file:
        # the lock goes when the writer ends, whatever its outcome
        child = subprocess.Popen(["sh", "-c", 'trap \'rm -f "$0"\' EXIT; "$@"', str(lock), *command],
                                 stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, ENV: str(path)})
    os.write(fd, str(child.pid).encode())
    os.close(fd)
    return log_path


def _alive(lock: Path) -> bool:
    """Whether the writer named in ``lock`` runs (an empty lock is a writer starting, for a minute)."""
    import time

    try:
        text = lock.read_text().strip()
        if not text:
            return time.time() - lock.stat().st_mtime < 60
        pid = int(text)
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except (ValueError, OSError):
        return False
    return True
