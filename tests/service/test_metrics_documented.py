from __future__ import annotations

import re
from pathlib import Path

import pytest

from changelake.metrics import REGISTRY

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _families() -> list:
    """Every family, the driver JVM's included (read at scrape time once the runner watches the JVM)."""
    import os

    from changelake.metrics import JVM

    JVM.watch(os.getpid(), heap=lambda: {"heap_used": 1})
    try:
        return [m for m in REGISTRY.collect() if m.name.startswith("changelake_")]
    finally:
        JVM.watch(None)


def _exported() -> set[str]:
    return {m.name + ("_total" if m.type == "counter" else "") for m in _families()}


def test_every_exported_metric_is_documented_and_nothing_else():
    documented = set(re.findall(r"^\| `(changelake_[a-z_]+)` \|", DOC.read_text(), flags=re.M))
    assert documented == _exported()


def test_names_follow_prometheus_conventions():
    for m in _families():
        if m.type == "histogram":
            assert m.name.endswith("_seconds"), m.name
