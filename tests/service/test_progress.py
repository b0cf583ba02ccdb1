"""Spark's progress reports -> offsets and lag."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_offsets_that_spark_reports_as_null_are_none():
    # A restarted available-now query whose only batch replays the one a crash interrupted reports
    # latestOffset "null" in its last progress: the run must still end cleanly.
    from changelake.spark.progress import lag_by_partition, parse_offsets

    assert parse_offsets("null") == {} and parse_offsets(None) == {}
    assert lag_by_partition({"latestOffset": "null", "endOffset": '{"t": {"0": 5}}'}) == {}
    assert lag_by_partition({"latestOffset": '{"t": {"0": 7}}', "endOffset": '{"t": {"0": 5}}'}) == {("t", "0"): 2}


def test_the_catch_up_line_counts_per_source_from_the_runs_first_offsets():
    from changelake.service.catchup import CatchUpTracker, SourceProgress, format_progress_line

    now = [100.0]
    tracker = CatchUpTracker({"db.orders": "orders", "db.products": "products"}.get, clock=lambda: now[0])
    now[0] = 102.0
    first = tracker.observe({"sources": [{
        "startOffset": '{"db.orders": {"0": 1000, "1": 0}, "db.products": {"0": 0}}',
        "endOffset": '{"db.orders": {"0": 1600, "1": 400}, "db.products": {"0": 50}}',
        "latestOffset": '{"db.orders": {"0": 5000, "1": 1000}, "db.products": {"0": 50}, "other": {"0": 9}}'}]})
    assert first == [SourceProgress("orders", 1000, 4000, 2.0), SourceProgress("products", 50, 0, 2.0)]
    now[0] = 104.0
    second = tracker.observe({"sources": [{
        "startOffset": '{"db.orders": {"0": 1600, "1": 400}, "db.products": {"0": 50}}',
        "endOffset": '{"db.orders": {"0": 2600, "1": 400}, "db.products": {"0": 50}}',
        "latestOffset": '{"db.orders": {"0": 5000, "1": 1000}, "db.products": {"0": 50}}'}]})
    orders = second[0]
    assert (orders.done, orders.remaining, orders.rate, orders.eta_seconds) == (2000, 3000, 500.0, 6.0)
    assert format_progress_line(second) == ("orders: 2,000 done, 3,000 left, 500/s, ETA 6 s | "
                                            "products: 50 done, 0 left, 12/s, ETA 0 s")
    assert format_progress_line([SourceProgress("x", 0, 7_200_000, 3.0)]) == "x: 0 done, 7,200,000 left, 0/s, ETA ?"
    assert "ETA 2 h 00 min" in format_progress_line([SourceProgress("x", 1000, 7_200_000, 1.0)])
