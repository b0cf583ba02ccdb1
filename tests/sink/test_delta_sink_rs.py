"""delta-rs engine specifics: conflict retries, failures, maintenance errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from deltalake.exceptions import CommitFailedError

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.errors import SinkCommitError
from changelake import metrics

from .tables import changes, live, seq, tombstones

pytestmark = pytest.mark.unit


def _metric(counter, **labels) -> float:
    return counter.labels(**labels)._value.get()


@pytest.fixture
def rs_sink(tmp_path, clock):
    def make(name: str, **options):
        spec = TableSpec(name=name, path=str(tmp_path / name), primary_key=("id",), **options)
        return open_sink(spec, pipeline_id="p", engine="delta-rs", clock=clock, max_commit_retries=2)
    return make


def _fail_first(sink, method: str, errors: list[Exception]):
    real = getattr(sink, method)

    def flaky(*args, **kwargs):
        if errors:
            raise errors.pop(0)
        return real(*args, **kwargs)

    setattr(sink, method, flaky)


def test_concurrent_write_conflict_is_retried_and_counted(rs_sink):
    sink = rs_sink("retried")
    sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    _fail_first(sink, "_merge_table", [CommitFailedError("conflict with a concurrent OPTIMIZE")])
    before = _metric(metrics.COMMIT_RETRIES, table="retried")
    result = sink.apply(changes([("+U", 1, 2, "b"), ("-D", 2, 2, None)]), batch_id=1)
    assert result.committed and result.upserts == 1
    assert live(sink.spec.path) == {1: ("b", seq(2))}
    assert tombstones(sink.tombstone_path) == {2: seq(2)}
    assert _metric(metrics.COMMIT_RETRIES, table="retried") - before == 1


def test_conflicts_beyond_the_retry_limit_fail_the_batch(rs_sink):
    sink = rs_sink("exhausted")
    conflicts = [CommitFailedError(f"conflict {i}") for i in range(3)]
    _fail_first(sink, "_merge_table", conflicts)
    before = _metric(metrics.COMMIT_FAILURES, table="exhausted")
    with pytest.raises(SinkCommitError, match="commit of batch 0 to .* failed after 2 retries: conflict 2"):
        sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    assert _metric(metrics.COMMIT_FAILURES, table="exhausted") - before == 1
    assert sink.committed_batch_id() is None


def test_failed_tombstone_expiry_does_not_fail_the_committed_batch(rs_sink, clock):
    sink = rs_sink("maint", tombstone_retention=timedelta(hours=1), tombstone_expiry_interval=timedelta(hours=1))
    sink.apply(changes([("-D", 1, 1, None)]), batch_id=0)
    clock.advance(timedelta(hours=2))
    _fail_first(sink, "_delete_tombstones_before", [OSError("object store unavailable")])
    result = sink.apply(changes([("+I", 2, 1, "b")]), batch_id=1)
    assert result.committed and tombstones(sink.tombstone_path) == {1: seq(1)}
    sink.apply(changes([("+I", 3, 1, "c")]), batch_id=2)  # expiry is tried again with the next batch
    assert tombstones(sink.tombstone_path) == {}
