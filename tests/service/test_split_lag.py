"""The lag gauges of a pipeline that runs two queries (changelake.service.split): each query's listener follows
its own progress reports, and a partition's gauge shows the query further behind."""

from __future__ import annotations

import pytest

from changelake import metrics
from changelake.spark.progress import ProgressListener

pytestmark = pytest.mark.unit


class _Health:
    def batch_finished(self, progress) -> None:
        pass


def _progress(name: str, batch: int, done: int, latest: int) -> dict:
    return {"name": name, "batchId": batch, "durationMs": {}, "numInputRows": 0,
            "sources": [{"endOffset": {"t.split": {"0": done}}, "latestOffset": {"t.split": {"0": latest}}}]}


def test_a_partition_lags_as_the_query_further_behind():
    lags: dict = {}
    graph = ProgressListener(_Health(), query="p", lags=lags)
    mirrors = ProgressListener(_Health(), query="p.mirrors", lags=lags)
    gauge = metrics.CONSUMER_LAG.labels("t.split", "0")
    graph.record_progress(_progress("p", 0, 100, 500))          # the graph: 400 behind
    mirrors.record_progress(_progress("p.mirrors", 7, 490, 500))  # the mirrors: 10 behind
    assert gauge._value.get() == 400
    graph.record_progress(_progress("p", 1, 495, 500))          # the graph caught up: the mirrors' lag shows
    assert gauge._value.get() == 10
    assert mirrors.last_lag == {("t.split", "0"): 10} and graph.last_lag == {("t.split", "0"): 5}
