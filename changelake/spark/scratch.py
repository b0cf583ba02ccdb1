"""A local session's scratch files, and what killed sessions left of theirs.

Spark's driver JVM writes its scratch files to ``spark.local.dir`` and the JVM's temporary directory: each
micro-batch's shuffle files (``blockmgr-*``), the RocksDB state stores' working copies (``spark-*``), and the
native libraries RocksDB and LZ4 unpack at every start (``librocksdbjni*.so``, ~14 MB each). A JVM that stops
deletes them; a killed one (SIGKILL, the OOM killer, a container's restart) leaves them: 200-250 MB per kill of
the soak's pipeline (bench/soak.py). A pod that restarts its container keeps its ``/tmp`` (the writable layer, an
``emptyDir``), so a crash loop fills the node's disk.

So on a local master the session this process starts writes under a directory of its own,
``<scratch>/changelake-spark/<host>-<pid>-<start time>`` (``<scratch>``: ``CHANGELAKE_SCRATCH_DIR``, else the system's
temporary directory; the chart points it at its ``/tmp/spark`` volume), and every start first deletes the
directories of this host's processes that are gone (:func:`sweep`). The start time (the kernel's, in clock
ticks) tells a process from a later one that was given the same pid; the host name keeps a start away from the
directories of another host's or container's processes (their pids mean nothing here) on a shared volume.
Without ``/proc`` nothing is swept (nothing can tell a live process from a reused pid).
A user's ``spark.local.dir``, ``SPARK_LOCAL_DIRS`` or ``-Djava.io.tmpdir`` is left as it is (``session.py``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: the directory under the scratch directory that holds one directory per session's process
ROOT = "changelake-spark"
#: the scratch directory (default: the system's temporary directory)
ENV = "CHANGELAKE_SCRATCH_DIR"

_NAME = re.compile(r"^(.+)-(\d+)-(\d+)$")


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks since boot (``/proc/PID/stat``), None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def session_dir(root: Path | None = None) -> Path:
    """This process's scratch directory (created), after the directories of processes that are gone were
    deleted."""
    root = Path(os.environ.get(ENV) or tempfile.gettempdir()) / ROOT if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    swept = sweep(root)
    if swept:
        log.info("deleted the scratch files of %d Spark session(s) that ended without cleaning up (a killed "
                 "process): %s", len(swept), ", ".join(p.name for p in swept))
    mine = root / own_name()
    mine.mkdir(exist_ok=True)
    return mine


def own_name(pid: int | None = None) -> str:
    """The directory name of process ``pid`` (default: this one) of this host: ``<host>-<pid>-<start ticks>``."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}-{pid}-{start_ticks(pid) or 0}"


def sweep(root: Path) -> list[Path]:
    """Delete the directories under ``root`` of this host's processes that are gone; returns them. Names that are
    not ``<host>-<pid>-<start ticks>`` of this host are left alone, and so is everything where ``/proc`` is
    missing."""
    if not os.path.isdir("/proc/self"):
        return []
    host = socket.gethostname()
    gone = []
    for entry in root.iterdir():
        m = _NAME.match(entry.name)
        if m is None or m.group(1) != host or not entry.is_dir():
            continue
        pid, ticks = int(m.group(2)), int(m.group(3))
        if start_ticks(pid) == ticks:
            continue                # its process still runs
        shutil.rmtree(entry, ignore_errors=True)
        gone.append(entry)
    return gone
