"""Helpers shared by the benchmarks: process-tree memory sampling and machine facts."""

from __future__ import annotations

import os
import platform
import threading
import time
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
    """Samples the RSS of this process, the Spark JVM and the Python workers every ``interval`` s."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_mb = {"driver (python)": 0.0, "spark jvm": 0.0, "python workers (sum)": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            jvm = workers = 0
            stack = _children(me)
            while stack:
                pid = stack.pop()
                cmd = _cmdline(pid)
                if "java" in cmd.split(" ", 1)[0]:
                    jvm += _rss_kb(pid)
                elif "pyspark" in cmd or "python" in cmd:
                    workers += _rss_kb(pid)
                stack.extend(_children(pid))
            self._update("driver (python)", _rss_kb(me))
            self._update("spark jvm", jvm)
            self._update("python workers (sum)", workers)
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
