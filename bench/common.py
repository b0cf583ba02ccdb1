"""Helpers shared by the benchmarks: process-tree memory sampling, machine facts, the broker a
benchmark runs against, and running a job in another interpreter (PyFlink lives in its own venv).

Every benchmark that reads Kafka takes ``--broker`` (:func:`add_broker_option`) and says which one it
used (:func:`open_broker` prints it, and its report carries :attr:`Broker.label`):

============  ==========================================================================================
``real``      Apache Kafka (KRaft, one node) from the project's ``kafka`` JVM set
              (changelake/connectors/kafka_broker.py), in a temporary directory; topics a producer
              creates get 4 partitions, as on the mock. The default where the set is installed
``embedded``  librdkafka's mock cluster (changelake/connectors/embedded_broker.py): not Kafka (5 MB per
              partition kept, a fixed LogAppendTime, no offset index); the default without the set
============  ==========================================================================================

Both run in a child process whose memory :class:`PeakMemory` leaves out (``exclude=(broker.pid,)``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: PyFlink's own interpreter (apache-flink==2.3.0 in a venv of its own), the benchmarks' --flink-python default
DEFAULT_FLINK_PYTHON = "/tmp/venv-flink/bin/python"
BROKERS = ("real", "embedded")
#: the real broker's settings for the benchmarks: auto-created topics get 4 partitions (as on the mock,
#: so every benchmark keeps its topic layout) and records of any age are kept
BENCH_BROKER_SETTINGS = {"num.partitions": "4", "log.retention.ms": "-1"}
#: the real broker's JVM in a --quick (smoke) run: C1 only, as the tests' broker (it lives seconds)
QUICK_BROKER_JAVA_OPTIONS = ("-Xmx512m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                             "-Djava.awt.headless=true")


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    """The process's proportional set size (``/proc/PID/smaps_rollup``): each page shared with other processes
    (a fork's pages still shared copy-on-write with its parent) counted as its share only."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            kids = (task / "children").read_text().split()
            out.extend(int(k) for k in kids)
    except OSError:
        pass
    return out


def _is_jvm(cmdline: str) -> bool:
    return "java" in cmdline.split(" ", 1)[0]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class PeakMemory:
    """Samples the memory of a process tree: the root process (default: this one), the JVMs below it (a
    local-cluster's executor JVMs apart) and the other Python processes below it (Spark's Python workers, the
    executors' included).

    ========================  ================================================================================
    figure                    what it sums, sampled how often
    ========================  ================================================================================
    ``peak_mb``, ``total_mb``  RSS (``VmRSS``) per part and the peak of the sum, every ``interval`` s. A page
                              that forks share copy-on-write (Spark's Python workers are forks of one warm
                              process) is counted once in every process that maps it
    ``pss_mb``,               PSS (``smaps_rollup``) per part and the peak of the sum, every ``pss_every``
    ``total_pss_mb``          samples (reading it costs ~20 ms for a JVM): each shared page split between the
                              processes sharing it, so the sum is what the tree really holds
    ========================  ================================================================================

    The tree itself is walked again every ``pss_every`` samples (a JVM's threads each list their children).
    ``exclude``: pids whose subtrees are not counted (e.g. an embedded broker started by the benchmark, which is
    not part of the system measured).
    """

    PARTS = ("driver (python)", "spark jvm", "python workers (sum)", "executor jvms (sum)")

    def __init__(self, interval: float = 0.25, *, root: int | None = None, exclude: Iterable[int] = (),
                 pss_every: int = 4, pss: bool = True) -> None:
        self.interval = interval
        #: whether PSS is read at all: a benchmark that reports RSS only leaves it off, since reading a JVM's
        #: ``smaps_rollup`` every second took ~7 % of a core in bench/freshness.py (py-spy), on the cores measured
        self.pss = pss
        self.root = root
        self.exclude = frozenset(exclude)
        self.pss_every = pss_every
        self.restart()
        #: pids of the processes seen that Spark's Python fork server forked (changelake/spark/fork_server.py)
        self.forked: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self, me: int) -> list[tuple[int, str]]:
        """(pid, part) of every process of the tree. The root is the driver's Python process, unless it is a JVM:
        spark-submit's (``bench/scaleout.py``), whose child running the application is then the driver."""
        under_submit = _is_jvm(_cmdline(me))
        out = [(me, self.PARTS[1] if under_submit else self.PARTS[0])]
        stack = [(pid, me) for pid in _children(me)]
        while stack:
            pid, parent = stack.pop()
            if pid in self.exclude:
                continue
            cmd = _cmdline(pid)
            if _is_jvm(cmd) and "CoarseGrainedExecutorBackend" in cmd:
                out.append((pid, self.PARTS[3]))      # a local-cluster's executor JVMs (children of the driver's)
            elif _is_jvm(cmd):
                out.append((pid, self.PARTS[1]))
            elif under_submit and parent == me and " -m " not in f" {cmd} ":
                out.append((pid, self.PARTS[0]))      # the application spark-submit's JVM started (Spark starts
                #                                       its own Python processes as ``-m module``)
            elif "pyspark" in cmd or "python" in cmd:
                out.append((pid, self.PARTS[2]))
            children = _children(pid)
            if "changelake.spark.fork_server" in cmd:      # the server, or a fork of it (same command line)
                self.forked.update(children)
            stack.extend((child, pid) for child in children)
        return out

    def _run(self) -> None:
        me = os.getpid() if self.root is None else self.root
        tree: list[tuple[int, str]] = []
        n = 0
        while not self._stop.is_set():
            with_pss = n % self.pss_every == 0
            if with_pss:
                tree = self._tree(me)
            self._sample(tree, _rss_kb, self.peak_mb, "total_mb")
            if with_pss and self.pss:
                self._sample(tree, _pss_kb, self.pss_mb, "total_pss_mb")
            n += 1
            time.sleep(self.interval)

    def _sample(self, tree: list[tuple[int, str]], read, peaks: dict[str, float], total: str) -> None:
        kb = dict.fromkeys(self.PARTS, 0)
        for pid, part in tree:
            kb[part] += read(pid)
        for part, value in kb.items():
            peaks[part] = max(peaks[part], value / 1024)
        setattr(self, total, max(getattr(self, total), sum(kb.values()) / 1024))

    def restart(self) -> None:
        """Start the peaks again (from the next sample): what one of several runs in the same processes reached."""
        self.peak_mb = dict.fromkeys(self.PARTS, 0.0)
        self.pss_mb = dict.fromkeys(self.PARTS, 0.0)
        self.total_mb = self.total_pss_mb = 0.0

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def machine() -> str:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {mem_gb:.0f} GiB, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, {jvm_archive_state()}")


def jvm_archive_state() -> str:
    """Whether Spark's JVM starts with changelake's class-data-sharing archive here (a start ~2-5 s faster on
    2 cores; ``changelake jvm-archive`` writes it): figures taken with and without it do not compare."""
    from changelake.spark import jvm_archive

    path = jvm_archive.archive_path()
    if path is None:
        return f"JVM class archive off ({jvm_archive.ENV})"
    return f"JVM class archive {'in use' if path.is_file() else 'absent (changelake jvm-archive writes it)'}"


def dir_size(path: Path) -> tuple[int, int]:
    """(bytes, parquet files) under ``path``."""
    size = files = 0
    for p in path.rglob("*"):
        if p.is_file():
            size += p.stat().st_size
            files += p.suffix == ".parquet"
    return size, files


@dataclass
class JobRun:
    seconds: float                  # wall time of the subprocess, interpreter and JVM start included
    stdout: str
    peak_mb: dict[str, float]       # as PeakMemory.peak_mb, for the subprocess's tree
    total_mb: float
    total_pss_mb: float = 0.0       # as PeakMemory.total_pss_mb


def run_python_job(python: str, script: Path, args: Sequence[str], *, nice: int | None = None) -> JobRun:
    """Run ``script`` with another interpreter (e.g. PyFlink's venv) and time it; raise on failure.

    ``nice``: added niceness; by default none, so the job runs at the benchmark's own niceness, as changelake's
    side does (a peer at ``nice 19`` in a benchmark at 0 gets a sliver of a loaded machine's CPU and its time, not
    the system's, is what the ratio then measures)."""
    cmd = [python, str(script), *args] if not nice else ["nice", "-n", str(nice), python, str(script), *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(root=proc.pid) as mem:
        out, err = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-3000:]}")
    return JobRun(seconds, out, dict(mem.peak_mb), mem.total_mb, mem.total_pss_mb)


def pyflink_missing(python: str) -> str | None:
    """Why ``python`` cannot run the PyFlink peer (no such interpreter, or no ``pyflink`` in it), or None."""
    if not Path(python).exists():
        return f"no interpreter at {python} (install apache-flink==2.3.0 in a venv there, or pass --flink-python)"
    done = subprocess.run([python, "-c", "import pyflink"], capture_output=True, text=True)
    if done.returncode:
        return f"{python} cannot import pyflink (pip install apache-flink==2.3.0 there)"
    return None


def skip_pyflink(python: str, *, quick: bool, skipped: bool) -> bool:
    """Whether a benchmark leaves out its PyFlink peer: when asked to; in a quick (smoke) run, when PyFlink
    is not installed. A full run without PyFlink stops, saying how to go on without it."""
    if skipped:
        return True
    why = pyflink_missing(python)
    if why is None:
        return False
    if quick:
        print(f"pyflink: skipped in the quick run: {why}", flush=True)
        return True
    raise SystemExit(f"the PyFlink peer cannot run: {why}; or pass --skip-pyflink")


@dataclass(frozen=True)
class Broker:
    kind: str                 # "real" or "embedded"
    bootstrap_servers: str
    pid: int                  # the broker's process (left out of the memory measured)
    label: str                # what it is, for the report: "Apache Kafka 4.3.0 (KRaft, 1 node)"


def add_broker_option(ap) -> None:
    """``--broker real|embedded`` on an argparse parser (default: :func:`default_broker`)."""
    ap.add_argument("--broker", choices=BROKERS, default=None,
                    help="the Kafka broker to run against: real (Apache Kafka from the project's `kafka` JVM "
                         "set; the default where it is installed) or embedded (librdkafka's mock cluster)")


def default_broker() -> str:
    """``real`` where the ``kafka`` JVM set is installed, else ``embedded`` (saying why)."""
    from changelake import jvm_deps

    why = jvm_deps.missing("kafka")
    if why is None:
        return "real"
    print(f"broker: the embedded mock broker, since {why}", flush=True)
    return "embedded"


def _kafka_version() -> str:
    from changelake import jvm_deps

    names = [j.name for j in jvm_deps.jars("kafka") if j.name.startswith("kafka_2.13-")]
    return names[0][len("kafka_2.13-"):-len(".jar")] if names else "?"


@contextmanager
def open_broker(kind: str | None, *, quick: bool = False) -> Iterator[Broker]:
    """The broker ``kind`` (None: :func:`default_broker`), started for the ``with`` block; prints which it is.
    ``--broker real`` without the ``kafka`` JVM set stops, saying how to install it."""
    kind = kind or default_broker()
    if kind == "real":
        from changelake import jvm_deps
        from changelake.connectors.kafka_broker import DEFAULT_JAVA_OPTIONS, LocalKafka

        why = jvm_deps.missing("kafka")
        if why:
            raise SystemExit(f"--broker real: {why}; or pass --broker embedded")
        started = time.perf_counter()
        with LocalKafka(settings=BENCH_BROKER_SETTINGS,
                        java_options=QUICK_BROKER_JAVA_OPTIONS if quick else DEFAULT_JAVA_OPTIONS) as kafka:
            broker = Broker("real", kafka.bootstrap_servers, kafka._procs[1].pid,
                            f"Apache Kafka {_kafka_version()} (KRaft, 1 node)")
            print(f"broker: real, {broker.label} at {broker.bootstrap_servers}, started in "
                  f"{time.perf_counter() - started:.1f}s (the project's `kafka` JVM set; logs in {kafka.workdir})",
                  flush=True)
            yield broker
        return
    from changelake.connectors.embedded_broker import EmbeddedBroker

    with EmbeddedBroker() as mock:
        broker = Broker("embedded", mock.bootstrap_servers, mock._proc.pid if mock._proc else 0,
                        "embedded mock broker (librdkafka mock cluster, not Kafka)")
        print(f"broker: embedded, {broker.label} at {broker.bootstrap_servers}", flush=True)
        yield broker


def kafka_records(progress: dict) -> int | None:
    """Kafka records a micro-batch read, from its Spark progress: the offsets between its start and
    end (``numInputRows`` counts the decode stage's payloads, a few per task). None without a start."""
    total = 0
    for source in progress.get("sources", []):
        start, end = source.get("startOffset"), source.get("endOffset")
        start, end = (json.loads(o) if isinstance(o, str) else o for o in (start, end))
        if not isinstance(start, dict) or not isinstance(end, dict):
            return None
        total += sum(int(o) - int(start.get(t, {}).get(p, 0)) for t, ps in end.items() for p, o in ps.items())
    return total
