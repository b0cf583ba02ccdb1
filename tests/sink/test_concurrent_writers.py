"""Another job writes the table while changelake does: its commit lands between the sink's read of the table
and the sink's own commit (the worst moment), made so on purpose by running the job from inside the sink's
MERGE call, before the MERGE itself.

    the other job's commit               the sink
    OPTIMIZE (compact, Z-order)          a conflict: retried from the replay check, committed once
    VACUUM of the files it removed       the sink's snapshot lists deleted files: retried, committed once
    ADD COLUMN                           retried; the column kept, null in the rows the sink inserts
    a schema the sink cannot write to    stops with an error naming the table and the column
      (its key or _seq column dropped)
    the batch itself (commit applied,    found as this batch's transaction id: a replay, not written again
      its reply lost)

In every case each change is in the table once: compared key by key with what the batches hold.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from changelake import metrics
from changelake.connectors.delta_sink import Maintenance
from changelake.errors import SinkCommitError

from .tables import changes, live, read_rows

pytestmark = pytest.mark.unit

engine = pytest.fixture(lambda: "delta-rs")


def _before_merge(sink, job) -> list[int]:
    """Run ``job(path)`` once, inside the sink's next table MERGE, before it commits; returns a list that
    counts the MERGE attempts."""
    attempts: list[int] = []
    original = sink._merge

    def merge(table, source, clauses, batch_id):
        if "_changelake_tombstones" not in table.table_uri:
            attempts.append(batch_id)
            if len(attempts) == 1:
                job(sink.spec.path)
        return original(table, source, clauses, batch_id)

    sink._merge = merge
    return attempts


def _retries(name: str) -> float:
    return metrics.COMMIT_RETRIES.labels(table=name)._value.get()


def _first_batches(sink) -> None:
    for b in range(4):           # four files, so that OPTIMIZE has something to do
        sink.apply(changes([("+I", 10 * b + i, 10 * b + i, f"v{b}") for i in range(5)]), batch_id=b)


EXPECTED_AFTER = {**{10 * b + i: f"v{b}" for b in range(4) for i in range(5)}, 0: "new", 1: None, 99: "late"}


def _last_batch(sink):
    return sink.apply(changes([("+U", 0, 100, "new"), ("-D", 1, 101, None), ("+I", 99, 102, "late")]), batch_id=4)


def _compact(path):
    DeltaTable(path).optimize.compact()


def _z_order(path):
    DeltaTable(path).optimize.z_order(["id"])


def _compact_and_vacuum(path):
    table = DeltaTable(path)
    table.optimize.compact()
    table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)


def _add_column(path):
    from deltalake import Field

    DeltaTable(path).alter.add_columns([Field("note", "string", nullable=True)])


@pytest.mark.parametrize("job", [_compact, _z_order, _compact_and_vacuum, _add_column],
                         ids=["optimize", "z-order", "optimize+vacuum", "add-column"])
def test_a_concurrent_commit_is_retried_and_every_change_lands_once(make_sink, job):
    sink = make_sink("t")
    _first_batches(sink)
    retries = _retries("t")
    attempts = _before_merge(sink, job)
    result = _last_batch(sink)
    assert result.committed
    assert len(attempts) == 2, attempts                 # the first MERGE lost to the other job, the retry won
    assert _retries("t") == retries + 1
    rows = read_rows(sink.spec.path, columns="id, v")
    assert len(rows) == len({r["id"] for r in rows})     # no key twice
    assert {r["id"]: r["v"] for r in rows} == {k: v for k, v in EXPECTED_AFTER.items() if k != 1}
    assert DeltaTable(sink.spec.path).transaction_version(sink.app_id) == 4
    if job is _add_column:                              # the other job's column stays
        assert "note" in DeltaTable(sink.spec.path).schema().to_arrow().names
    again = _last_batch(sink)                           # the batch replayed (a restart): nothing written
    assert not again.committed


def test_a_schema_the_sink_cannot_write_stops_it_with_the_column_named(make_sink):
    sink = make_sink("t")
    _first_batches(sink)

    def drop_seq(path):
        kept = pa.table({"id": pa.array([0], pa.int64()), "v": pa.array(["x"])})
        write_deltalake(path, kept, mode="overwrite", schema_mode="overwrite")

    _before_merge(sink, drop_seq)
    with pytest.raises(SinkCommitError, match="lacks the _seq column"):
        _last_batch(sink)
    assert {r["id"]: r["v"] for r in read_rows(sink.spec.path, columns="id, v")} == {0: "x"}   # nothing added


def test_a_commit_whose_reply_was_lost_is_found_as_a_replay(make_sink, monkeypatch):
    """The object store applied the MERGE's commit but the client heard an error (tests/objstore runs the
    same against an S3 API that loses the reply): the retry finds the batch's transaction id there."""
    from deltalake.exceptions import CommitFailedError

    sink = make_sink("t")
    _first_batches(sink)
    original = sink._merge
    calls: list[int] = []

    def merge_then_lose_reply(table, source, clauses, batch_id):
        out = original(table, source, clauses, batch_id)
        if "_changelake_tombstones" in table.table_uri:
            return out
        calls.append(batch_id)
        if len(calls) == 1:
            raise CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")
        return out

    sink._merge = merge_then_lose_reply
    result = _last_batch(sink)
    assert not result.committed and len(calls) == 1     # the retry found the batch committed: no second MERGE
    rows = read_rows(sink.spec.path, columns="id, v")
    assert {r["id"]: r["v"] for r in rows} == {k: v for k, v in EXPECTED_AFTER.items() if k != 1}


def test_the_sinks_own_maintenance_runs_after_its_commits_and_a_failure_only_defers_it(make_sink, clock):
    """changelake's compaction runs in the sink's thread after the batch's commits (never beside them); when
    another job's commit makes it fail, the batch stays committed and the compaction runs when next due."""
    sink = make_sink("t", maintenance=Maintenance(compact_every=timedelta(minutes=1), compact_min_files=2))
    _first_batches(sink)
    failed = metrics.MAINTENANCE.labels(table="t", operation="compact", result="failed")._value.get()
    original = sink._compact_table
    raced = []

    def compact_after_another_job():
        if not raced:
            raced.append(1)
            DeltaTable(sink.spec.path).optimize.compact()       # another job compacts first: nothing left, or a conflict
            raise RuntimeError("injected: a concurrent commit made this compaction fail")
        original()

    sink._compact_table = compact_after_another_job
    clock.advance(timedelta(minutes=2))
    assert _last_batch(sink).committed
    assert metrics.MAINTENANCE.labels(table="t", operation="compact", result="failed")._value.get() == failed + 1
    assert DeltaTable(sink.spec.path).transaction_version(sink.app_id) == 4
    for b in range(5, 8):                                       # more small files, then the compaction is due again
        clock.advance(timedelta(minutes=2))
        sink.apply(changes([("+I", 1000 + b, 1000 + b, "x")]), batch_id=b)
    assert len(raced) == 1 and sink._files(sink.spec.path)[0] <= 2
    assert {k: v[0] for k, v in live(sink.spec.path).items()} == {
        **{k: v for k, v in EXPECTED_AFTER.items() if k != 1}, **{1000 + b: "x" for b in range(5, 8)}}
