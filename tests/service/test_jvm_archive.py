"""The Spark JVM's class-data-sharing archive (changelake/spark/jvm_archive.py): where it is looked for,
how a new driver JVM is given it, and ``changelake jvm-archive`` writing one that a session then maps in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from changelake.spark import jvm_archive, jvm_options


@pytest.fixture
def no_archive_env(monkeypatch):
    for name in (jvm_archive.ENV, jvm_archive.DUMP_ENV, "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.unit
def test_the_default_path_is_in_the_user_cache_and_depends_on_the_java(no_archive_env, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = jvm_archive.default_path()
    assert first.parent == tmp_path / "changelake" and first.suffix == ".jsa"
    assert jvm_archive.archive_path() == first
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "another-jdk"))
    assert jvm_archive.default_path() != first          # another JDK looks for its own archive
    monkeypatch.delenv("JAVA_HOME")
    import pyspark
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "other-venv" / "pyspark" / "__init__.py"))
    assert jvm_archive.default_path() != first          # so does another venv's pyspark (other jar paths)


@pytest.mark.unit
def test_a_given_path_or_off(no_archive_env, monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path / "spark.jsa"))
    assert jvm_archive.archive_path() == tmp_path / "spark.jsa"
    monkeypatch.setenv(jvm_archive.ENV, "off")
    assert jvm_archive.archive_path() is None
    assert jvm_archive.java_options() is None


@pytest.mark.unit
def test_the_jvm_is_given_the_archive_only_where_one_exists(no_archive_env, monkeypatch, tmp_path):
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    assert jvm_archive.java_options() is None            # none written yet: the JVM starts as before
    archive.write_bytes(b"x")
    options = jvm_archive.java_options()
    assert f"-XX:SharedArchiveFile={archive}" in options and "-Xshare:auto" in options
    assert "-Xlog:cds=off" in options                    # one that does not fit this JVM is dropped silently
    monkeypatch.setenv(jvm_archive.DUMP_ENV, str(tmp_path / "dump.jsa"))
    assert jvm_archive.java_options().startswith(f"-XX:ArchiveClassesAtExit={tmp_path / 'dump.jsa'}")


@pytest.mark.unit
def test_jvm_options_that_choose_the_sharing_themselves_win(no_archive_env, monkeypatch, tmp_path):
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"x")
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    assert jvm_archive.java_options("-Xmx2g") is not None
    assert jvm_archive.java_options("-Xmx2g -Xshare:off") is None                 # spark.driver.extraJavaOptions
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC -XX:SharedArchiveFile=/tmp/theirs.jsa")
    assert jvm_archive.java_options() is None


@pytest.mark.unit
def test_a_failing_run_leaves_the_archive_as_it_was(no_archive_env, tmp_path):
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"the previous archive")
    with pytest.raises(RuntimeError, match="exit 3"):
        jvm_archive.write([sys.executable, "-c", "import sys; sys.exit(3)"], archive)
    with pytest.raises(RuntimeError, match="wrote no archive"):
        jvm_archive.write([sys.executable, "-c", "pass"], archive)
    assert archive.read_bytes() == b"the previous archive"


_PROBE = """
import json, os, sys, time
import pyarrow
from changelake.spark.session import build_session
t = time.monotonic()
spark = build_session(app_name="archive-probe", master="local[1]", ui=False)
management = spark._jvm.java.lang.management.ManagementFactory
args = list(management.getRuntimeMXBean().getInputArguments())
collectors = [bean.getName() for bean in management.getGarbageCollectorMXBeans()]
arenas = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("MALLOC_ARENA_MAX")).collect()
pools = spark.sparkContext.parallelize([0], 1).map(lambda _: pyarrow.default_memory_pool().backend_name).collect()
print(json.dumps({"args": args, "collectors": collectors, "rows": spark.range(3).count(),
                  "start_s": time.monotonic() - t, "jvm_arenas": spark._jvm.java.lang.System.getenv("MALLOC_ARENA_MAX"),
                  "worker_arenas": arenas[0], "worker_pool": pools[0],
                  "driver_pool": pyarrow.default_memory_pool().backend_name}))
"""


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.spark
def test_jvm_archive_writes_an_archive_that_a_new_session_maps_in(tmp_path):
    """``changelake jvm-archive`` runs the demo in a child whose JVM dumps its classes, moves the archive into
    place, and a session started afterwards runs its JVM with it (and still works); with
    ``CHANGELAKE_JVM_ARCHIVE=off`` it does not."""
    archive = tmp_path / "cache" / "spark.jsa"
    # the tests' own archive (SPARK_SUBMIT_OPTS, tests/conftest.py) would take precedence over the product's
    # (and MALLOC_ARENA_MAX, which this process's own session may have set)
    env = {k: v for k, v in os.environ.items()
           if k not in (jvm_archive.DUMP_ENV, "PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS",
                        "MALLOC_ARENA_MAX", "ARROW_DEFAULT_MEMORY_POOL")}
    env[jvm_archive.ENV] = str(archive)
    cli = Path(sys.executable).with_name("changelake")
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "changelake.service.cli"]
    out = subprocess.run([*command, "jvm-archive", "--changes", "300"], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert archive.is_file() and archive.stat().st_size > 10 * 2**20      # Spark's classes, not an empty file
    assert str(archive) in out.stdout
    assert not list(archive.parent.glob("*.part"))

    mapped = _probe(env)
    assert f"-XX:SharedArchiveFile={archive}" in mapped["args"] and mapped["rows"] == 3
    # a local master's driver JVM runs the parallel collector (changelake/spark/jvm_options.py), the archive
    # (dumped by a JVM that ran it too) mapped in beside it
    assert "-XX:+UseParallelGC" in mapped["args"] and "PS Scavenge" in mapped["collectors"]
    assert set(jvm_options.LOCAL_HEAP_SIZING) <= set(mapped["args"])      # its heap sizing, which the JVM took
    # and the first-tier JIT (the product's default on a local master; nothing here sets it)
    assert "-XX:TieredStopAtLevel=1" in mapped["args"]
    # the JVM and its Python workers run with glibc's malloc arenas capped (changelake/spark/session.py)
    assert (mapped["jvm_arenas"], mapped["worker_arenas"]) == ("2", "2")
    # and Arrow's buffers, in the workers and the driver, come from glibc's allocator (not pyarrow's mimalloc)
    assert (mapped["worker_pool"], mapped["driver_pool"]) == ("system", "system")
    # a collector of the user's (here the way the tests give theirs) wins, and the JVM starts: no second one;
    # so do the user's own arena count and Arrow allocator
    plain = _probe({**env, jvm_archive.ENV: "off", "SPARK_SUBMIT_OPTS": "-XX:+UseSerialGC", "MALLOC_ARENA_MAX": "8",
                    "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"})
    assert not any(a.startswith("-XX:SharedArchiveFile") for a in plain["args"]) and plain["rows"] == 3
    assert "-XX:+UseParallelGC" not in plain["args"] and "MarkSweepCompact" in plain["collectors"]
    assert (plain["jvm_arenas"], plain["worker_arenas"]) == ("8", "8")
    assert (plain["worker_pool"], plain["driver_pool"]) == ("jemalloc", "jemalloc")


@pytest.mark.unit
def test_a_first_run_writes_the_archive_in_the_background_once(no_archive_env, monkeypatch, tmp_path):
    """``make install`` no longer writes the archive in front of the first demo: the first successful demo
    (or interactive run) starts ``changelake jvm-archive`` detached, once, and returns at once."""
    import time

    archive = tmp_path / "cache" / "spark.jsa"
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    writer = [sys.executable, "-c", "import os, sys, time; time.sleep(1.5); "
              f"open(os.environ[{jvm_archive.ENV!r}], 'w').write('archive')"]
    started = time.monotonic()
    log = jvm_archive.write_in_background(writer)
    assert time.monotonic() - started < 1.0 and log == archive.with_name("spark.jsa.log")
    lock = archive.with_name("spark.jsa.writing")
    assert lock.is_file()
    assert jvm_archive.write_in_background(writer) is None          # one writer at a time
    deadline = time.monotonic() + 30
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert archive.read_text() == "archive" and not lock.exists()   # the lock goes with the writer
    assert jvm_archive.write_in_background(writer) is None          # written: nothing more to do
    archive.unlink()
    lock.write_text("999999999")                                    # a writer that died
    assert jvm_archive.write_in_background([sys.executable, "-c", "pass"]) is not None
    monkeypatch.setenv(jvm_archive.ENV, "off")
    assert jvm_archive.write_in_background(writer) is None


@pytest.mark.unit
def test_make_install_does_not_write_the_archive():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    rules = makefile.split("install: $(STAMP)")[0].split(".PHONY")[1]       # the install rules
    assert "$(RUN_STAMP): pyproject.toml" in rules and "jvm-archive" not in rules
