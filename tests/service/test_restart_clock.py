"""changelake_restart_to_first_commit_seconds: each phase once, the total from the process's start."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from changelake import metrics
from changelake.service.restart_clock import PHASES, RestartClock, process_start_time

pytestmark = pytest.mark.unit


def _gauge(phase: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("changelake_restart_to_first_commit_seconds", {"phase": phase})


def test_the_phases_add_up_to_the_total_and_only_the_first_batch_counts(caplog):
    clock = RestartClock(started=time.time() - 10)
    for phase in PHASES[:-1]:
        clock.mark(phase)
    with caplog.at_level(logging.INFO, logger="changelake.service.restart_clock"):
        clock.mark("commit")
    phases = {p: _gauge(p) for p in PHASES}
    assert phases["start"] >= 10 and all(v is not None and v >= 0 for v in phases.values())
    assert _gauge("total") == pytest.approx(sum(phases.values()), abs=0.05)
    assert "restart to first commit: " in caplog.text and "start 1" in caplog.text and "lease 0" in caplog.text
    clock.mark("read")          # a later batch changes nothing
    clock.mark("commit")
    assert _gauge("commit") == phases["commit"] and clock.done


def test_the_process_start_is_the_kernels():
    started = process_start_time()
    assert started <= time.time()
    # a process that waits before it imports changelake: its start is the kernel's (Linux), not the import's
    code = ("import time; time.sleep(1.5); from changelake import metrics;"
            "from changelake.service.restart_clock import process_start_time;"
            "print(metrics.PROCESS_START._value.get() - process_start_time())")
    ahead = float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    if os.path.exists("/proc/self/stat"):
        assert 1.4 <= ahead < 30
    else:                                   # no /proc: the import of changelake's metrics, as documented
        assert ahead == 0
