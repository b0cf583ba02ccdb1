from __future__ import annotations

import re
from pathlib import Path

import pytest

from changelake.metrics import REGISTRY

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _exported() -> set[str]:
    return {m.name + ("_total" if m.type == "counter" else "") for m in REGISTRY.collect()}


def test_every_exported_metric_is_documented_and_nothing_else():
    documented = set(re.findall(r"^\| `(changelake_[a-z_]+)` \|", DOC.read_text(), flags=re.M))
    assert documented == _exported()


def test_names_follow_prometheus_conventions():
    for m in REGISTRY.collect():
        assert m.name.startswith("changelake_")
        if m.type == "histogram":
            assert m.name.endswith("_seconds"), m.name
