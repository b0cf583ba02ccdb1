"""Helpers shared by the benchmarks: process-tree memory sampling, machine facts, and running
a job in another interpreter (PyFlink lives in its own venv)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
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


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class PeakMemory:
    """Samples the RSS of a process tree every ``interval`` s: the root process (default: this
    one), the JVMs below it and the other Python processes below it (Spark's Python workers).

    ``exclude``: pids whose subtrees are not counted (e.g. an embedded broker started by the
    benchmark, which is not part of the system measured). ``total_mb`` is the peak of the sum.
    """

    def __init__(self, interval: float = 0.25, *, root: int | None = None, exclude: Iterable[int] = ()) -> None:
        self.interval = interval
        self.root = root
        self.exclude = frozenset(exclude)
        self.peak_mb = {"driver (python)": 0.0, "spark jvm": 0.0, "python workers (sum)": 0.0}
        self.total_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid() if self.root is None else self.root
        while not self._stop.is_set():
            jvm = workers = 0
            stack = _children(me)
            while stack:
                pid = stack.pop()
                if pid in self.exclude:
                    continue
                cmd = _cmdline(pid)
                if "java" in cmd.split(" ", 1)[0]:
                    jvm += _rss_kb(pid)
                elif "pyspark" in cmd or "python" in cmd:
                    workers += _rss_kb(pid)
                stack.extend(_children(pid))
            driver = _rss_kb(me)
            self._update("driver (python)", driver)
            self._update("spark jvm", jvm)
            self._update("python workers (sum)", workers)
            self.total_mb = max(self.total_mb, (driver + jvm + workers) / 1024)
            time.sleep(self.interval)

    def _update(self, key: str, kb: int) -> None:
        self.peak_mb[key] = max(self.peak_mb[key], kb / 1024)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def machine() -> str:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem_gb:.0f} GiB, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


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


def run_python_job(python: str, script: Path, args: Sequence[str], *, nice: int = 19) -> JobRun:
    """Run ``script`` with another interpreter (e.g. PyFlink's venv) and time it; raise on failure."""
    cmd = ["nice", "-n", str(nice), python, str(script), *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(root=proc.pid) as mem:
        out, err = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-3000:]}")
    return JobRun(seconds, out, dict(mem.peak_mb), mem.total_mb)


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
