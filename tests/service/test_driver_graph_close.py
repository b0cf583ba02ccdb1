"""The views behind the transaction gate (``service.driver_graph``) close their lookup joins' connections when
the run ends, and when a replayed batch restores an earlier state."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake.plan import Lookup, Pipeline
from changelake.service.driver_graph import DriverGraph

pytestmark = pytest.mark.unit


def _graph(tmp_path) -> DriverGraph:
    write_deltalake(str(tmp_path / "products"), pa.table({"id": pa.array([1], pa.int64()), "category": ["a"]}))
    lookup = Lookup.delta("products", str(tmp_path / "products"), columns={"id": "bigint", "category": "string"},
                          key=["id"])
    p = Pipeline()
    p.source("orders", columns={"order_id": "bigint", "product_id": "bigint"}, primary_key=["order_id"]) \
        .lookup_join(lookup, on={"product_id": "id"}, name="with_category") \
        .to_table("lines", primary_key=["order_id"])
    return DriverGraph(p.plan())


def test_closing_the_graph_closes_every_lookup_joiner(tmp_path, monkeypatch):
    graph = _graph(tmp_path)
    joiners = list(graph.runner.joiners.values())
    assert joiners, "the plan has a lookup join"
    closed = []
    for joiner in joiners:
        monkeypatch.setattr(joiner, "close", lambda j=joiner: closed.append(j))
    graph.close()
    assert closed == joiners


def test_a_restore_closes_the_runner_it_replaces(tmp_path, monkeypatch):
    graph = _graph(tmp_path)
    old = graph.runner
    closed = []
    monkeypatch.setattr(old, "close", lambda: closed.append(old))
    graph.restore(None)
    assert closed == [old] and graph.runner is not old
