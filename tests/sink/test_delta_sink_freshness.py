"""``changelake_table_freshness_seconds`` (commit time minus each change's source time) for every engine and
both ways a batch reaches the sink: a pyarrow.Table on the driver, or a DataFrame counted on the executors."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from changelake import metrics

from .tables import changes

#: the changes' ages at the commit, in seconds: far from the bucket bounds (3600, 14400, 86400), so that a slow
#: commit (a busy machine: a minute) keeps each in its bucket; -30: a source clock ahead of ours, counted as 0
AGES = (5400.0, 5400.0, 36000.0, 200000.0, -30.0)


def _freshness(table: str) -> tuple[dict[float, int], int, float]:
    """(per upper bound: the changes at or below it, count, sum) of one table's freshness histogram."""
    family = next(metrics.FRESHNESS.collect())
    samples = [s for s in family.samples if s.labels.get("table") == table]
    buckets = {float(s.labels["le"]): int(s.value) for s in samples if s.name.endswith("_bucket")}
    count = next((int(s.value) for s in samples if s.name.endswith("_count")), 0)
    total = next((s.value for s in samples if s.name.endswith("_sum")), 0.0)
    return buckets, count, total


def test_freshness_counts_every_committed_change_once_per_engine(make_sink, engine):
    table = f"fresh_{engine.replace('-', '_')}"
    sink = make_sink(table)
    now = time.time()
    ts = pa.array([int((now - age) * 1000) for age in AGES] + [None], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    batch = changes([("+I", 1, 1, "a"), ("+U", 1, 2, "b"), ("+I", 2, 3, "c"), ("+I", 3, 4, "d"), ("+I", 4, 5, "e"),
                     ("+I", 5, 6, "f")], extra={"_source_ts": ts})
    before = time.time()
    sink.apply(batch, batch_id=0)
    took = time.time() - before
    buckets, count, total = _freshness(table)
    # the five changes with a source time, both of key 1's included; the one without is not counted
    assert count == 5
    assert (buckets[0.5], buckets[3600.0], buckets[14400.0], buckets[86400.0], buckets[float("inf")]) == (1, 1, 3, 4, 5)
    expected = sum(max(age, 0.0) for age in AGES)
    assert expected <= total <= expected + 4 * (took + 1.0)
    # a replay of the batch (after a restart) commits nothing, and counts nothing
    sink.apply(batch, batch_id=0)
    assert _freshness(table)[1] == 5
    # a batch without source times (an aggregate's rows) counts nothing either
    sink.apply(changes([("+I", 9, 7, "z")]), batch_id=1)
    assert _freshness(table)[1] == 5


@pytest.mark.unit
def test_bucket_counts_made_elsewhere_add_up_as_observations_do():
    hist = metrics.BulkHistogram("changelake_test_counts_seconds", "test", "table", buckets=(1, 10),
                                 registry=metrics.CollectorRegistry())
    hist.observe_many("a", [0.5, 2, 20])
    hist.observe_counts("b", [1, 1, 1], 22.5)
    family = next(hist.collect())
    by_table = {t: [(s.labels.get("le"), s.value) for s in family.samples if s.labels["table"] == t] for t in "ab"}
    assert by_table["a"] == by_table["b"]
    with pytest.raises(ValueError, match="2 bucket counts for 3 buckets"):
        hist.observe_counts("c", [1, 1], 2.0)
