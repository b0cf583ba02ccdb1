"""Restart to first commit: how long a (re)started pipeline takes until its first micro-batch is done.

After a crash or a pod restart nothing reaches the tables until the new process has a Spark session,
has started its query and has run one micro-batch to its end (Delta commits done; Spark then records
the batch's offsets). :class:`RestartClock` times the phases of that path once per process and sets
``changelake_restart_to_first_commit_seconds{phase}``; the run logs them on one line
(``restart to first commit: ...``), which ``bench/soak.py`` reads per fault.

=========  =====================================================================================
phase      from .. to
=========  =====================================================================================
start      the process's start (the kernel's start time of this process) .. the run begins (Python,
           changelake's imports, the configuration read)
preflight  .. the broker listed its topics (the first connection to Kafka)
lease      .. the pipeline's lease taken (``changelake.service.lease``; after a SIGKILL on this host at
           once, from another host once the old holder's ``lease_ttl`` has passed)
check      .. the start check done (the checkpoint against the tables and views: the Delta logs read)
session    .. a Spark session (the driver JVM started, jars, the class-data archive mapped in)
query      .. the query started (checkpoint and lineage checks, the sink tables' Delta logs, the plan)
plan       .. Spark hands changelake its first batch (offsets planned and logged, the batch planned)
read       .. the first batch's data on the driver (Python workers started, Kafka read, decode, the
           operators' state stores opened and run)
commit     .. the first batch's Delta commits done (a replayed batch: its commits found done)
total      the process's start .. the end of the first batch
=========  =====================================================================================
"""

from __future__ import annotations

import logging
import os
import time

from changelake import metrics

log = logging.getLogger(__name__)

PHASES = ("start", "preflight", "lease", "check", "session", "query", "plan", "read", "commit")


def process_start_time() -> float:
    """Unix time this process started, from /proc (Linux); else when changelake's metrics were imported.

    The age comes from two clocks that count from the boot (the process's start ticks and
    ``/proc/uptime``) and is subtracted from now: ``btime`` in ``/proc/stat`` is not used, because it
    moves when the wall clock is stepped or a virtual machine is paused. The result is never later
    than the import of changelake's metrics, which this process certainly did after it started.
    """
    imported = metrics.PROCESS_START._value.get()
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return imported
    age = max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    return min(time.time() - age, imported)


class RestartClock:
    """Marks the end of each phase (:data:`PHASES`) once; the first batch's end sets the metric and logs it."""

    def __init__(self, started: float | None = None) -> None:
        self.started = process_start_time() if started is None else started
        self._last = self.started
        self.phases: dict[str, float] = {}

    @property
    def done(self) -> bool:
        return "commit" in self.phases

    def mark(self, phase: str) -> None:
        """``phase`` ended now (ignored once set, or after the first commit)."""
        if phase in self.phases or self.done:
            return
        now = time.time()
        self.phases[phase] = max(0.0, now - self._last)
        self._last = now
        metrics.RESTART_TO_FIRST_COMMIT.labels(phase).set(self.phases[phase])
        if phase == "commit":
            total = now - self.started
            metrics.RESTART_TO_FIRST_COMMIT.labels("total").set(total)
            log.info("restart to first commit: %.2f s (%s)", total,
                     ", ".join(f"{p} {self.phases.get(p, 0.0):.2f} s" for p in PHASES))
