"""The JVM options the user gave a driver JVM changelake starts itself, and the collector changelake adds.

:func:`changelake.spark.session.driver_java_options` gives a new driver JVM three options, each only where
nothing the user gave chooses the same thing (:func:`chooses`):

* the class-data-sharing archive (:mod:`changelake.spark.jvm_archive`);
* here, on a local master (``local``, ``local[N]``: the driver JVM also runs every task), the parallel
  collector, :data:`LOCAL_COLLECTOR`. The JVM picks G1 on a machine of 2 cores and 2 GB or more; on the
  2-core machine of docs/benchmarks.md the parallel collector took query (a) of ``bench/operators.py``
  from 22.3-22.7 s to 20.6-21.6 s and (b) from 38.0-40.8 s to 36.2-40.4 s (three alternated pairs), and
  left a micro-batch of the demo graph (1.62-1.69 s against 1.68-1.69 s) and the 10,000 events/s mirror
  freshness (p99 1.99 s against 2.00 s) where they were: G1's concurrent threads share the task threads'
  cores, and a micro-batch's garbage dies young. A cluster's executors are other JVMs, left alone.

  With it, :data:`LOCAL_HEAP_SIZING`: the collector's heap sized to what the batches keep alive rather than
  to a 1 % GC-time goal (``GCTimeRatio=99``, the JVM's default, grows the heap towards ``spark.driver.memory``
  whenever a collection costs more than 1 % of the time: 1.3 GB committed around ~100 MB of live objects). In
  ``bench/soak.py`` at 5,000 events/s the driver JVM held 1,333 MB against 1,607-1,632 MB over the same
  minutes, and grew +50 against +125 MB per 10 minutes; ``bench/operators.py`` ran (a) in 22.6 against
  28.2 s and (b) in 63.6 against 57.1 s (~11 % slower: the join's working set in a heap kept small), the
  JVM's peak 517 against 686-1,366 MB and 811-844 against 1,327-1,487 MB (docs/benchmarks.md, "The Spark
  JVM's heap sized to its live set"). Each option is left out where the user's options set that flag.

  And the heap's start, :data:`LOCAL_INITIAL_HEAP_MB`, where it is below the JVM's own (a 64th of the memory:
  378 MB on the 24-GiB machine of docs/benchmarks.md): the heap then grows from there as the batches need it
  instead of starting with pages it never shrinks below (``bench/operators.py``: the JVM's peak PSS 421-422
  against 497 MB for (a), 513-523 against 568-583 MB for (b), in the same time; docs/benchmarks.md, "Arrow's
  buffers from glibc's allocator, and a smaller start of the JVM's heap"). Left out where the user's options
  set ``-Xms``, ``-XX:InitialHeapSize`` or ``-XX:InitialRAMPercentage``.

* on a local master as well, the JIT held at its first tier (C1), :data:`LOCAL_JIT`. The second tier (C2)
  compiles hot methods again, harder, in compiler threads that share the task threads' two cores at every
  start: the JVM's CPU to a restart's first commit went from 16.0 to 8.4 s with C1 only, and the median
  restart to first commit of ``bench/restart.py`` from 15.3 to 13.0 s (quiet machine). No workload measured
  ran slower for it: issue 29's join graph at 2,000 changes/s had its Spark action at 1.59 and 1.36 s with both
  tiers against 1.39 s (quiet A/B/A), and ``bench/operators.py`` under load (21-41) took (a) 72 and 102 s
  against 125 and 112 s, (b) 249 and 262 s against 301 and 278 s (alternated pairs): the heavy part of a
  batch runs in Python, and the JVM's share is not hot enough for C2 to pay for its compiling. A user whose
  pipeline runs long at full load on a larger machine gives ``-XX:TieredStopAtLevel=4`` to get C2 back.
  Not with ``storage.engine: delta-spark`` (:data:`JVM_ENGINES`): there the reduction, the tombstone split, both
  MERGEs and the Parquet writes run in the JVM, and C2 pays: ``bench/mirror.py --engine delta-spark`` (1 M
  events, batches of 250,000, quiet machine, two alternated pairs) took 115.5 and 115.5 s with both tiers
  against 126.5 and 134.5 s with C1 only, its warm batches 15.4-22.4 s against 23.3-31.3 s
  (docs/benchmarks.md, "delta-spark on a quiet machine").

What the user gave: ``spark.driver.extraJavaOptions`` (the launcher's or the pipeline's) and the variables
Spark's launcher and the JVM read options from, :data:`OPTION_VARIABLES`. A collector chosen there (any
``-XX:+Use...GC``) wins; two collectors in one JVM's options stop it from starting. A JIT setting there
(``-XX:TieredStopAtLevel=N``, ``-XX:[+-]TieredCompilation``) wins as well.
"""

from __future__ import annotations

import os
import re

#: where a launcher gives the driver JVM options of its own (besides ``spark.driver.extraJavaOptions``)
OPTION_VARIABLES = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")

#: the collector of a local master's driver JVM (module docstring)
LOCAL_COLLECTOR = "-XX:+UseParallelGC"

#: how the local collector sizes its heap (module docstring): a GC-time goal of 20 % instead of 1 %,
#: the pause-time history weighted to the last collections, and the heap shrunk once over 30 % of it is free
LOCAL_HEAP_SIZING = ("-XX:GCTimeRatio=4", "-XX:AdaptiveSizePolicyWeight=90", "-XX:MinHeapFreeRatio=10",
                     "-XX:MaxHeapFreeRatio=30")

#: the initial heap of a local master's driver JVM, where the JVM's own is larger (module docstring)
LOCAL_INITIAL_HEAP_MB = 192

#: the JIT of a local master's driver JVM (module docstring)
LOCAL_JIT = "-XX:TieredStopAtLevel=1"

#: the ``storage.engine`` values whose batches do their heavy work in the JVM: both JIT tiers (module docstring)
JVM_ENGINES = ("delta-spark",)

_COLLECTOR_OPTION = re.compile(r"(?:^|\s)-XX:[+-]Use\w*GC(?=\s|$)")
_INITIAL_HEAP_OPTION = re.compile(r"(?:^|\s)-(?:Xms|XX:InitialHeapSize=|XX:InitialRAMPercentage=)")
_JIT_OPTION = re.compile(r"(?:^|\s)-XX:(?:TieredStopAtLevel=\d+|[+-]TieredCompilation)(?=\s|$)")


def given(*options: str) -> list[str]:
    """``options`` and the environment's :data:`OPTION_VARIABLES`: every JVM option the user gave."""
    return [o for o in (*options, *(os.environ.get(v, "") for v in OPTION_VARIABLES)) if o]


def chooses(pattern: re.Pattern, *options: str) -> bool:
    """True when an option the user gave (:func:`given`) matches ``pattern``."""
    return any(pattern.search(o) for o in given(*options))


def runs_tasks(master: str) -> bool:
    """True for a master whose tasks run in the driver JVM: ``local``, ``local[N]``, ``local[N,F]``, ``local[*]``."""
    return master == "local" or master.startswith("local[")


def collector(master: str, *options: str) -> str | None:
    """The collector options for a new driver JVM of ``master`` (:data:`LOCAL_COLLECTOR`, each of
    :data:`LOCAL_HEAP_SIZING` the user's options do not set, and the initial heap of the module docstring), or
    None: not a local master, or ``options`` (``spark.driver.extraJavaOptions``) or the environment choose a
    collector themselves."""
    chosen = _local_default(master, LOCAL_COLLECTOR, _COLLECTOR_OPTION, options)
    if chosen is None:
        return None
    sizing = [o for o in LOCAL_HEAP_SIZING if not chooses(_same_flag(o), *options)]
    if memory_bytes() // 64 > LOCAL_INITIAL_HEAP_MB * 2**20 and not chooses(_INITIAL_HEAP_OPTION, *options):
        sizing.append(f"-XX:InitialHeapSize={LOCAL_INITIAL_HEAP_MB}m")
    return " ".join([chosen, *sizing])


#: where a container's memory limit is (cgroup v2, v1)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_bytes(limits: tuple[str, ...] = CGROUP_LIMITS) -> int:
    """The memory the JVM sizes its heap from: the machine's, or the container's limit where lower (``limits``),
    as the JVM reads it."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in limits:
        try:
            with open(limit) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


def _same_flag(option: str) -> re.Pattern:
    """What a setting of ``option``'s flag looks like: ``-XX:GCTimeRatio=4`` -> any ``-XX:GCTimeRatio=N``."""
    return re.compile(r"(?:^|\s)" + re.escape(option.split("=", 1)[0]) + "=")


def jit(master: str, *options: str, engine: str = "auto") -> str | None:
    """The JIT option for a new driver JVM of ``master``, or None: not a local master, an ``engine``
    (``storage.engine``) of :data:`JVM_ENGINES`, or ``options`` (``spark.driver.extraJavaOptions``) or the
    environment choose the JIT's tiers themselves."""
    if engine in JVM_ENGINES:
        return None
    return _local_default(master, LOCAL_JIT, _JIT_OPTION, options)


def _local_default(master: str, option: str, chosen_by: re.Pattern, options: tuple[str, ...]) -> str | None:
    """``option`` for a local master's driver JVM, unless the user's options match ``chosen_by``."""
    if not runs_tasks(master) or chooses(chosen_by, *options):
        return None
    return option
