"""delta-rs engine specifics: conflict retries, failures, maintenance errors."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.connectors.object_store import StoreBrownout
from changelake.errors import SinkCommitError
from changelake import metrics

from .tables import changes, live, read_rows, seq, tombstones

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


def _never(seconds: float) -> None:
    raise AssertionError(f"a wait of {seconds} s for an error that is not transient or has lasted too long")


_SLOW_DOWN = ("Generic S3 error: Error performing PUT http://s3/lake/t/_delta_log/00000000000000000001.json in "
              "4.4s, after 10 retries, max_retries 10, retry_timeout 180s - <Error><Code>SlowDown</Code></Error>")


def test_a_store_failing_for_a_while_is_outlasted_and_the_lost_reply_writes_nothing_twice(rs_sink, monkeypatch):
    sink = rs_sink("brownout")
    sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    slept = []
    monkeypatch.setattr(StoreBrownout, "sleep", staticmethod(slept.append))     # this sink's waits, no other thread's
    real = sink._merge_table
    calls = []

    def merge_then_lose_the_reply(*args, **kwargs):     # 503s, then one commit applied whose reply was lost
        calls.append(1)
        if len(calls) <= 3:
            raise OSError(_SLOW_DOWN)
        if len(calls) == 4:
            real(*args, **kwargs)
            raise OSError("Generic S3 error: error sending request for url (http://s3/lake/t/_delta_log/...)")
        return real(*args, **kwargs)

    sink._merge_table = merge_then_lose_the_reply
    before = _metric(metrics.COMMIT_RETRIES, table="brownout")
    result = sink.apply(changes([("+U", 1, 2, "b"), ("+I", 3, 2, "c")]), batch_id=1)
    assert len(calls) == 4 and slept == [1.0, 2.0, 4.0, 8.0]          # the fifth try found the batch committed
    assert not result.committed
    assert live(sink.spec.path) == {1: ("b", seq(2)), 3: ("c", seq(2))}
    assert sink.committed_batch_id() == 1
    assert _metric(metrics.COMMIT_RETRIES, table="brownout") - before == 4


def test_a_store_error_that_is_not_transient_or_lasts_too_long_fails_the_batch(rs_sink, monkeypatch):
    monkeypatch.setattr(StoreBrownout, "sleep", staticmethod(_never))
    sink = rs_sink("denied")
    _fail_first(sink, "_merge_table", [OSError("Generic S3 error: 403 Forbidden <Code>AccessDenied</Code>")])
    with pytest.raises(SinkCommitError, match="AccessDenied"):
        sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    sink = rs_sink("brownout-too-long")
    sink._store_retry_s = 0.0
    _fail_first(sink, "_merge_table", [OSError(_SLOW_DOWN)])
    with pytest.raises(SinkCommitError, match="SlowDown"):
        sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)


def test_failed_tombstone_expiry_does_not_fail_the_committed_batch(rs_sink, clock):
    sink = rs_sink("maint", tombstone_retention=timedelta(hours=1), tombstone_expiry_interval=timedelta(hours=1))
    sink.apply(changes([("-D", 1, 1, None)]), batch_id=0)
    clock.advance(timedelta(hours=2))
    _fail_first(sink, "_delete_tombstones_before", [OSError("object store unavailable")])
    result = sink.apply(changes([("+I", 2, 1, "b")]), batch_id=1)
    assert result.committed and tombstones(sink.tombstone_path) == {1: seq(1)}
    sink.apply(changes([("+I", 3, 1, "c")]), batch_id=2)  # expiry is tried again with the next batch
    assert tombstones(sink.tombstone_path) == {}


@pytest.mark.parametrize("key_type, keys", [
    (pa.decimal128(38, 0),
     [Decimal(10**38 - 1), Decimal(2**63), Decimal(2**63 - 1), Decimal(10**38 - 1).copy_negate()]),
    # the NaN beside equal values: the file's statistics (which leave NaN out) say min = max
    (pa.float64(), [1e16, math.nan, 1e16]),
])
def test_upserts_keyed_by_a_decimal_or_a_double_update_their_own_row(tmp_path, clock, key_type, keys):
    """delta-rs's buffered MERGE (streamed_exec=False) filtered the target by the source's key range
    wrongly: a DECIMAL(38, 0) key beyond 2^63 never matched (each upsert added a row), and the row of
    a NaN key took the key of the row being upserted. Found by tests/spark/test_value_domain.py."""
    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("id", "k"))
    sink = open_sink(spec, pipeline_id="p", engine="delta-rs", clock=clock)

    def batch(n: int, rows) -> pa.Table:
        return pa.table({"id": pa.array([i for i, _, _ in rows], pa.int64()),
                         "k": pa.array([k for _, k, _ in rows], key_type),
                         "v": pa.array([v for _, _, v in rows], pa.int64()),
                         "_kind": pa.array([0 if n == 0 else 2] * len(rows), pa.int8()),
                         "_seq": [seq(n * 100 + i) for i in range(len(rows))]})

    sink.apply(batch(0, [(i, k, 0) for i, k in enumerate(keys)]), batch_id=0)
    for n, (i, k) in enumerate(enumerate(keys), start=1):
        sink.apply(batch(n, [(i, k, n)]), batch_id=n)
    rows = read_rows(spec.path, columns="id, k, v")
    assert [(r["id"], r["v"]) for r in rows] == [(i, i + 1) for i in range(len(keys))]
    for r, k in zip(rows, keys):
        assert r["k"] == k or (math.isnan(r["k"]) and math.isnan(k))


def test_dead_letters_outlast_a_failing_store_too(tmp_path, monkeypatch):
    import changelake.connectors.dead_letters as dead_letters
    from changelake.changelog import DEAD_LETTER_SCHEMA

    slept = []
    monkeypatch.setattr(StoreBrownout, "sleep", staticmethod(slept.append))
    store = dead_letters.DeadLetterStore(str(tmp_path / "dlq"), pipeline_id="p")
    real, calls = store._append_once, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise OSError(_SLOW_DOWN)
        return real(*args, **kwargs)

    store._append_once = flaky
    letter = pa.Table.from_pylist([{"topic": "t", "partition": 0, "offset": 5, "value": b"{bad", "reason": "malformed",
                                    "error": "not JSON"}], schema=DEAD_LETTER_SCHEMA)
    assert store.append(letter, source="s", batch_id=0)
    assert slept == [1.0, 2.0] and store.read().num_rows == 1
    store._append_once = lambda *a, **k: (_ for _ in ()).throw(OSError("403 Forbidden <Code>AccessDenied</Code>"))
    with pytest.raises(OSError, match="AccessDenied"):
        store.append(letter, source="s", batch_id=1)
