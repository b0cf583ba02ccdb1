"""Prometheus alert rules: one source file, exported metric names only, checked by promtool."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import yaml

from deploy_support import (
    CHART, DOCS, NAMESPACE, RULES, RULES_TEST, one, promql_metric_names, promtool, run_promtool,
)

pytestmark = pytest.mark.unit

CHART_RULES = CHART / "files" / "prometheus" / "rules.yaml"
NEEDS_PROMTOOL = pytest.mark.skipif(
    promtool() is None,
    reason="promtool not on PATH: install Debian's 'prometheus' package (apt-get install prometheus) to run it",
)


def _alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return _alerts(yaml.safe_load(RULES.read_text()))


def test_deploy_rules_and_chart_rules_are_one_file() -> None:
    assert os.path.samefile(RULES, CHART_RULES), (
        "deploy/prometheus/rules.yaml must be the chart's files/prometheus/rules.yaml (a symlink), not a copy")


def test_required_alerts_present(rules: list[dict[str, Any]]) -> None:
    by_metric = {name: alert["alert"] for alert in rules for name in promql_metric_names(alert["expr"])}
    for metric in ("changelake_consumer_lag_records", "changelake_last_batch_timestamp_seconds",
                   "changelake_dead_letters_total", "changelake_delta_commit_failures_total",
                   "changelake_expired_offsets_skipped_total"):
        assert metric in by_metric, f"no alert on {metric}"


def test_every_alert_names_only_exported_metrics(rules: list[dict[str, Any]], exported: set[str]) -> None:
    for alert in rules:
        names = promql_metric_names(alert["expr"])
        assert names, f"{alert['alert']} names no metric"
        assert names <= exported, f"{alert['alert']} uses metrics the service does not export: {names - exported}"


def test_metric_name_extraction_sees_foreign_names() -> None:
    # The check above is only as good as the extractor: it must see non-changelake series too.
    assert promql_metric_names('up{job="x"} == 0 and on (pod) kube_pod_info') == {"up", "kube_pod_info"}
    assert promql_metric_names(
        'histogram_quantile(0.9, sum by (le) (rate(changelake_batch_duration_seconds_bucket{a="b"}[5m])))'
    ) == {"changelake_batch_duration_seconds_bucket"}


def test_every_alert_is_documented(rules: list[dict[str, Any]]) -> None:
    docs = DOCS.read_text()
    headings = {h.strip().lower() for h in re.findall(r"^#+\s+(.+)$", docs, flags=re.M)}
    for alert in rules:
        assert {"summary", "description", "runbook_url"} <= set(alert["annotations"]), alert["alert"]
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["alert"].lower() in headings, f"docs/operations.md has no runbook section for {alert['alert']}"
        anchor = alert["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == alert["alert"].lower()


def test_rules_put_no_selector_on_changelake_metrics() -> None:
    # The chart adds a namespace/pipeline selector to every changelake metric; a
    # selector already there would make the rendered expression invalid.
    for alert in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]:
        assert not re.search(r"changelake_[a-z0-9_]+\s*\{", alert["expr"]), alert["alert"]


@NEEDS_PROMTOOL
def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


@NEEDS_PROMTOOL
def test_promtool_unit_tests_fire_each_alert(rules: list[dict[str, Any]]) -> None:
    tested = set(re.findall(r"alertname:\s*(\w+)", RULES_TEST.read_text()))
    assert tested == {a["alert"] for a in rules}, "every alert needs a promtool unit test"
    result = run_promtool("test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the chart's PrometheusRule --------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus_rule(render: Any) -> dict[str, Any]:
    return one(render({"prometheusRule": {
        "enabled": True, "labels": {"release": "kps"},
        "disabledAlerts": ["ChangelakeExpiredOffsetsSkipped"],
        "overrides": {"ChangelakeConsumerLagGrowing": {"for": "30m", "labels": {"severity": "critical", "team": "data"}}},
    }}), "PrometheusRule")


def test_prometheus_rule_renders_the_rules_file(prometheus_rule: dict[str, Any], rules: list[dict[str, Any]]) -> None:
    rendered = {r["alert"]: r for r in _alerts(prometheus_rule["spec"])}
    assert set(rendered) == {r["alert"] for r in rules} - {"ChangelakeExpiredOffsetsSkipped"}
    for source in rules:
        if source["alert"] in rendered:
            assert rendered[source["alert"]]["annotations"] == source["annotations"]
    lag = rendered["ChangelakeConsumerLagGrowing"]
    assert lag["for"] == "30m"
    assert lag["labels"] == {"severity": "critical", "team": "data"}
    assert rendered["ChangelakeNoRecentBatch"]["for"] == next(r["for"] for r in rules if r["alert"] == "ChangelakeNoRecentBatch")
    assert prometheus_rule["metadata"]["labels"]["release"] == "kps"


def test_prometheus_rule_scopes_every_metric_to_the_release(prometheus_rule: dict[str, Any], exported: set[str]) -> None:
    for alert in _alerts(prometheus_rule["spec"]):
        names = promql_metric_names(alert["expr"])
        assert names and names <= exported
        selectors = re.findall(r"(changelake_[a-z0-9_]+)(\{[^}]*\})?", alert["expr"])
        for metric, selector in selectors:
            assert selector == f'{{namespace="{NAMESPACE}",pipeline="inventory-mirror"}}', (alert["alert"], metric)


@NEEDS_PROMTOOL
def test_promtool_accepts_the_rendered_rules(prometheus_rule: dict[str, Any], tmp_path: Any) -> None:
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rule["spec"]))
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
