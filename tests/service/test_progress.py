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
