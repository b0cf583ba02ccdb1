"""A batch's two MERGEs at the same time (delta-spark, batches as DataFrames), and a crash between them.

delta-spark's ``apply_frame`` runs the tombstone MERGE in a thread of its own beside the table MERGE
(``commits_alongside``), so a crash can leave the table's commit without the tombstones' (the order
delta-rs keeps, tombstones first, makes that impossible there). The replay must then record the batch's
tombstones: skipping the batch as a replay would let a later, older change bring back a row the batch
deleted (changelake/connectors/delta_sink.py, module docstring). delta-rs runs the same cases as the
reference: there the failed tombstone commit stops the batch before the table's.
"""

from __future__ import annotations

import threading

import pytest
from deltalake import DeltaTable

from changelake.errors import SinkCommitError

from .conftest import ENGINES, engine_fixture
from .tables import changes, live, tombstones

engine = engine_fixture(tuple(p for p in ENGINES if p.values[0] in ("delta-rs", "delta-spark-frames")))


def _version(path: str) -> int:
    return DeltaTable(path).version() if DeltaTable.is_deltatable(path) else -1


def _recorded(sink) -> int | None:
    """The batch (commit position) the sink's tombstone table records; None before its first MERGE."""
    path = sink.tombstone_path
    return DeltaTable(path).transaction_version(sink.app_id) if DeltaTable.is_deltatable(path) else None


def _batches():
    return [
        changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b"), ("+I", 3, 1, "c")]),
        changes([("-D", 1, 4, None), ("+U", 2, 3, "b3"), ("-D", 3, 2, None), ("+I", 4, 2, "d")]),
        # 1@3 is older than batch 1's delete of 1 (at 4): only that tombstone keeps the row deleted;
        # 3@5 is newer than 3's tombstone (at 2): it clears it
        changes([("+U", 1, 3, "late"), ("+I", 3, 5, "c5")]),
        changes([("+U", 2, 6, "b6")]),
    ]


class Crash(Exception):
    pass


@pytest.mark.parametrize("crash_batch", [1, 2])
def test_crash_in_the_tombstone_commit_then_replay_ends_like_a_clean_run(make_sink, tmp_path, engine, crash_batch):
    crashed_path = str(tmp_path / "crashed" / "t")
    sink = make_sink(path=crashed_path)

    def crash(*args, **kwargs):
        raise Crash("process died in the tombstone commit")

    for batch_id, batch in enumerate(_batches()):
        if batch_id == crash_batch:
            recorded, table_version = _recorded(sink), _version(crashed_path)
            sink._merge_tombstones = crash
            with pytest.raises(SinkCommitError, match="process died"):
                sink.apply(batch, batch_id=batch_id)
            assert _recorded(sink) == recorded, "the tombstone commit did not happen"
            table_committed = engine == "delta-spark-frames"     # its MERGE ran beside the failed one
            assert (_version(crashed_path) > table_version) == table_committed
            sink = make_sink(path=crashed_path)  # restart; Spark replays the uncommitted batch
            replay = sink.apply(batch, batch_id=batch_id)
            assert replay.committed is not table_committed
            assert _recorded(sink) == batch_id, "the replay recorded the batch's tombstones"
            continue
        sink.apply(batch, batch_id=batch_id)

    # what a run without the crash gives (test_the_tombstone_merge_runs_beside... checks batch 1's step):
    # 1 stays deleted (its late update is older than its tombstone), 3's newer insert cleared its tombstone
    assert live(crashed_path) == {2: ("b6", "s0000000006"), 3: ("c5", "s0000000005"), 4: ("d", "s0000000002")}
    assert tombstones(sink.tombstone_path) == {1: "s0000000004"}
    assert sink.committed_batch_id() == 3


@pytest.mark.parametrize("last", [2, 3], ids=["with-tombstone-changes", "without"])
def test_replay_of_a_batch_both_tables_hold_writes_nothing(make_sink, last):
    """A restart that replays a batch committed in full writes nothing, whether the batch changed the
    tombstones (both tables record it) or not (only the table does: delta-spark splits it again to know)."""
    sink = make_sink()
    for batch_id, batch in enumerate(_batches()[:last + 1]):
        sink.apply(batch, batch_id=batch_id)
    versions = _version(sink.spec.path), _version(sink.tombstone_path)
    before = live(sink.spec.path), tombstones(sink.tombstone_path)
    restarted = make_sink(path=sink.spec.path)
    result = restarted.apply(_batches()[last], batch_id=last)
    assert not result.committed
    assert (_version(sink.spec.path), _version(sink.tombstone_path)) == versions
    assert (live(sink.spec.path), tombstones(sink.tombstone_path)) == before


def test_the_tombstone_merge_runs_beside_the_table_merge_on_delta_spark_before_it_on_delta_rs(make_sink, engine):
    """delta-spark (framed): the tombstone MERGE waits until the table MERGE has started, which it can only
    do if they run at the same time (one after the other, the wait would time out). delta-rs: the table
    MERGE has not started when the tombstone MERGE runs (tombstones first)."""
    alongside = engine == "delta-spark-frames"
    sink = make_sink()
    sink.apply(_batches()[0], batch_id=0)
    table_started = threading.Event()
    started_first: list[bool] = []
    merge_table, merge_tombstones = sink._merge_table, sink._merge_tombstones

    def table(*args, **kwargs):
        table_started.set()
        return merge_table(*args, **kwargs)

    def tombs(*args, **kwargs):
        started_first.append(table_started.wait(timeout=60) if alongside else table_started.is_set())
        return merge_tombstones(*args, **kwargs)

    sink._merge_table, sink._merge_tombstones = table, tombs
    sink.apply(_batches()[1], batch_id=1)
    assert started_first == [alongside]
    assert live(sink.spec.path) == {2: ("b3", "s0000000003"), 4: ("d", "s0000000002")}
    assert tombstones(sink.tombstone_path) == {1: "s0000000004", 3: "s0000000002"}
