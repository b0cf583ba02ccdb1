"""The Grafana dashboard: loads, covers the pipeline's signals, queries only exported metrics."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import pytest

from deploy_support import CHART, DASHBOARD, promql_metric_names

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            # Grafana's label_values(<series selector>, <label>): the selector is PromQL.
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query.strip())
            yield f"variable {var['name']}", match.group(1) if match else query


def test_deploy_dashboard_and_chart_dashboard_are_one_file() -> None:
    assert os.path.samefile(DASHBOARD, CHART / "files" / "dashboards" / "changelake.json")


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard):
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_query_names_only_exported_metrics(dashboard: dict[str, Any], exported: set[str]) -> None:
    queries = list(_queries(dashboard))
    assert len(queries) > 10
    for where, expr in queries:
        names = promql_metric_names(expr)
        assert names, f"{where}: query names no metric: {expr}"
        assert names <= exported, f"{where}: not exported by the service: {names - exported}"


def test_every_panel_with_data_has_a_query(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert panel.get("targets"), panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize("signal, metric, grouping", [
    ("throughput by kind", "changelake_changes_in_total", "by (kind)"),
    ("lag per partition", "changelake_consumer_lag_records", "by (topic, partition)"),
    ("batch duration quantiles", "changelake_batch_duration_seconds_bucket", "histogram_quantile(0.95"),
    ("dead letters by reason", "changelake_dead_letters_total", "reason)"),
    ("commit latency", "changelake_delta_commit_duration_seconds_bucket", "histogram_quantile("),
    ("table version", "changelake_delta_table_version", "by (table)"),
    ("files per table", "changelake_delta_table_files", "by (table)"),
    ("bytes per table", "changelake_delta_table_bytes", "by (table)"),
    ("state size", "changelake_state_bytes", "by (operator)"),
    ("last batch age", "changelake_last_batch_timestamp_seconds", "max_over_time("),
    ("quarantined tables", "changelake_table_quarantined", "by (table)"),
    ("freshness per table", "changelake_table_freshness_seconds_bucket", "histogram_quantile(0.99"),
    ("lag in seconds per partition", "changelake_consumer_lag_seconds", "by (topic, partition)"),
])
def test_dashboard_shows(signal: str, metric: str, grouping: str, dashboard: dict[str, Any]) -> None:
    matching = [expr for _, expr in _queries(dashboard) if metric in promql_metric_names(expr) and grouping in expr]
    assert matching, f"no panel shows {signal} ({metric} {grouping})"


def test_queries_filter_on_the_dashboard_variables(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            assert 'namespace=~"$namespace"' in target["expr"] and 'pipeline=~"$pipeline"' in target["expr"], panel["title"]
