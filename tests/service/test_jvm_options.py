"""The options changelake gives a driver JVM it starts (changelake/spark/jvm_options.py and
``session.driver_java_options``): the parallel collector and the first-tier JIT on a local master, and the
user's options winning."""

from __future__ import annotations

import os

import pytest

from changelake.spark import jvm_archive, jvm_options
from changelake.spark.session import driver_java_options

pytestmark = pytest.mark.unit

#: the function itself (the fixture below gives every test the same machine)
MEMORY_BYTES = jvm_options.memory_bytes


@pytest.fixture(autouse=True)
def no_option_env(monkeypatch):
    for name in (jvm_archive.ENV, jvm_archive.DUMP_ENV, *jvm_options.OPTION_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(jvm_archive.ENV, "off")
    monkeypatch.setattr(jvm_options, "memory_bytes", lambda: 24 * 2**30)     # the machine of docs/benchmarks.md


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,3]"])
def test_a_local_masters_driver_runs_the_parallel_collector_and_the_first_tier_jit(master):
    assert jvm_options.collector(master) == f"-XX:+UseParallelGC {SIZING}"
    assert jvm_options.jit(master) == "-XX:TieredStopAtLevel=1"
    assert driver_java_options(master) == f"-XX:+UseParallelGC {SIZING} -XX:TieredStopAtLevel=1"


def test_with_the_delta_spark_engine_the_driver_keeps_both_jit_tiers():
    # its MERGEs, window functions and Parquet writes run in the JVM, where C2 pays (jvm_options.JVM_ENGINES)
    assert jvm_options.jit("local[2]", engine="delta-spark") is None
    assert driver_java_options("local[2]", engine="delta-spark") == f"-XX:+UseParallelGC {SIZING}"
    for engine in ("auto", "delta-rs"):       # auto writes with delta-rs on a local master
        assert driver_java_options("local[2]", engine=engine) == f"-XX:+UseParallelGC {SIZING} -XX:TieredStopAtLevel=1"


#: the heap sizing that goes with the local collector: a 20 % GC-time goal, the heap shrunk when 30 % is free
#: and the heap's start below the JVM's own (a 64th of 24 GiB)
SIZING = ("-XX:GCTimeRatio=4 -XX:AdaptiveSizePolicyWeight=90 -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30 "
          "-XX:InitialHeapSize=192m")


@pytest.mark.parametrize("theirs, kept", [
    ("-XX:GCTimeRatio=19",
     "-XX:AdaptiveSizePolicyWeight=90 -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30 -XX:InitialHeapSize=192m"),
    ("-XX:MaxHeapFreeRatio=70 -XX:MinHeapFreeRatio=40",
     "-XX:GCTimeRatio=4 -XX:AdaptiveSizePolicyWeight=90 -XX:InitialHeapSize=192m"),
    ("-Xms1g", "-XX:GCTimeRatio=4 -XX:AdaptiveSizePolicyWeight=90 -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"),
    ("-XX:InitialRAMPercentage=5",
     "-XX:GCTimeRatio=4 -XX:AdaptiveSizePolicyWeight=90 -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"),
])
def test_a_heap_sizing_option_of_the_users_wins_over_that_option_alone(monkeypatch, theirs, kept):
    # the same flag twice would leave the JVM's choice to the order of the options: theirs is the only one
    assert jvm_options.collector("local[2]", theirs) == f"-XX:+UseParallelGC {kept}"
    monkeypatch.setenv("JDK_JAVA_OPTIONS", theirs)
    assert jvm_options.collector("local[2]") == f"-XX:+UseParallelGC {kept}"


def test_the_heap_starts_smaller_only_where_the_jvms_own_start_is_larger(monkeypatch):
    # a 64th of the memory (the JVM's default start, as it reads a container's limit): 12 GiB and less start at or
    # below 192 MB anyway, and the option would only raise it
    for gib, given in ((64, True), (16, True), (12, False), (4, False)):
        monkeypatch.setattr(jvm_options, "memory_bytes", lambda: gib * 2**30)
        assert ("-XX:InitialHeapSize=192m" in jvm_options.collector("local[2]")) is given, gib


def test_the_memory_is_the_containers_limit_where_lower(tmp_path):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")                                  # cgroup v2 without a limit
    assert MEMORY_BYTES(limits=(str(v2), str(v1))) == physical
    v2.write_text(f"{4 * 2**30}\n")                          # a pod's limit of 4 GiB
    assert MEMORY_BYTES(limits=(str(v2), str(v1))) == min(physical, 4 * 2**30)
    v1.write_text(f"{2**30}\n")                              # cgroup v1
    assert MEMORY_BYTES(limits=(str(tmp_path / "absent"), str(v1))) == min(physical, 2**30)


def test_a_collector_of_the_users_comes_without_the_sizing():
    # they chose the collector, so they tune it: none of changelake's sizing beside -XX:+UseG1GC
    assert driver_java_options("local[2]", "-XX:+UseG1GC") == "-XX:TieredStopAtLevel=1"


@pytest.mark.parametrize("master", ["local-cluster[2,1,1024]", "yarn", "k8s://https://kubernetes:443",
                                    "spark://host:7077"])
def test_a_cluster_masters_driver_is_left_alone(master):
    # the tasks run in the executors' JVMs; the driver's collector stays the JVM's choice
    assert jvm_options.collector(master) is None and jvm_options.jit(master) is None
    assert driver_java_options(master) is None


@pytest.mark.parametrize("theirs", ["-XX:+UseG1GC", "-Xmx4g -XX:+UseZGC -XX:+ZGenerational", "-XX:+UseSerialGC",
                                    "-XX:-UseParallelGC", "-XX:+UseShenandoahGC -Xss4m"])
def test_a_collector_in_the_extra_java_options_wins(theirs):
    # two collectors in one JVM's options stop it from starting ("conflicting collector combinations")
    assert jvm_options.collector("local[2]", theirs) is None
    assert jvm_options.collector("local[2]", "", theirs) is None       # the pipeline's, beside the launcher's


@pytest.mark.parametrize("variable", jvm_options.OPTION_VARIABLES)
def test_a_collector_in_the_launchers_environment_wins(monkeypatch, variable):
    monkeypatch.setenv(variable, "-Dx=1 -XX:+UseG1GC")
    assert jvm_options.collector("local[2]") is None


@pytest.mark.parametrize("theirs", ["-XX:TieredStopAtLevel=4", "-Xmx2g -XX:-TieredCompilation",
                                    "-XX:+TieredCompilation -Dx=1"])
def test_a_jit_setting_of_the_users_wins(monkeypatch, theirs):
    # C2 back for a pipeline that runs long at full load: the user's tiers, and no second TieredStopAtLevel
    assert jvm_options.jit("local[2]", theirs) is None
    assert driver_java_options("local[2]", theirs) == f"-XX:+UseParallelGC {SIZING}"
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", theirs)
    assert jvm_options.jit("local[2]") is None


def test_options_that_only_tune_the_jit_do_not_choose_its_tiers():
    assert jvm_options.jit("local[2]", "-XX:CICompilerCount=2 -XX:ReservedCodeCacheSize=64m") == \
        "-XX:TieredStopAtLevel=1"


def test_options_that_only_tune_a_collector_do_not_choose_one():
    assert jvm_options.collector("local[2]", "-XX:MaxGCPauseMillis=100 -XX:ParallelGCThreads=2 -Xmx2g") \
        == f"-XX:+UseParallelGC {SIZING}"


def test_the_archive_and_the_collector_together(monkeypatch, tmp_path):
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"x")
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    options = driver_java_options("local[2]").split()
    assert f"-XX:SharedArchiveFile={archive}" in options and "-XX:+UseParallelGC" in options
    # the user's collector drops only the collector, their archive choice only the archive
    assert driver_java_options("local[2]", "-XX:+UseG1GC").split() == \
        jvm_archive.java_options().split() + ["-XX:TieredStopAtLevel=1"]
    assert driver_java_options("local[2]", "-Xshare:off") == f"-XX:+UseParallelGC {SIZING} -XX:TieredStopAtLevel=1"
