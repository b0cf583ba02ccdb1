"""Behaviour of the Delta upsert sink, on every engine present."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from changelake.errors import SinkCommitError
from changelake import metrics

from .tables import changes, live, read_rows, seq, tombstones


def _metric(counter, **labels) -> float:
    return counter.labels(**labels)._value.get()


def test_latest_change_per_key_wins_within_a_batch(make_sink):
    sink = make_sink()
    batch = changes([
        ("+U", 1, 5, "a5"), ("+I", 1, 1, "a1"), ("-U", 1, 5, "a1"), ("+U", 1, 3, "a3"),
        ("+I", 2, 2, "b2"), ("-D", 2, 4, None),
        ("+I", 3, 1, "c1"), ("-U", 3, 2, "c1"), ("+U", 3, 2, "c2"),
    ])
    result = sink.apply(batch, batch_id=0)
    assert live(sink.spec.path) == {1: ("a5", seq(5)), 3: ("c2", seq(2))}
    assert tombstones(sink.tombstone_path) == {2: seq(4)}
    assert (result.committed, result.upserts, result.deletes, result.stale_ignored) == (True, 2, 0, 0)


def test_out_of_order_change_across_batches_is_ignored_and_counted(make_sink):
    sink = make_sink(name="ooo")
    sink.apply(changes([("+I", 1, 10, "new"), ("+I", 2, 1, "b")]), batch_id=0)
    before = _metric(metrics.STALE_CHANGES, table="ooo")
    result = sink.apply(changes([("+U", 1, 7, "old"), ("+U", 2, 2, "b2")]), batch_id=1)
    assert live(sink.spec.path) == {1: ("new", seq(10)), 2: ("b2", seq(2))}
    assert (result.upserts, result.stale_ignored) == (1, 1)
    assert _metric(metrics.STALE_CHANGES, table="ooo") - before == 1


def test_equal_seq_is_not_newer(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 4, "first")]), batch_id=0)
    result = sink.apply(changes([("+U", 1, 4, "same seq")]), batch_id=1)
    assert live(sink.spec.path) == {1: ("first", seq(4))}
    assert result.stale_ignored == 1


def test_late_update_after_delete_does_not_resurrect_the_row(make_sink):
    sink = make_sink(name="res")
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")]), batch_id=0)
    deleted = sink.apply(changes([("-D", 1, 5, None)]), batch_id=1)
    assert deleted.deletes == 1
    before = _metric(metrics.RESURRECTIONS_PREVENTED, table="res")
    late = sink.apply(changes([("+U", 1, 3, "late"), ("+I", 1, 2, "later-still")]), batch_id=2)
    assert live(sink.spec.path) == {2: ("b", seq(1))}
    assert tombstones(sink.tombstone_path) == {1: seq(5)}
    assert (late.resurrections_prevented, late.upserts) == (1, 0)
    assert _metric(metrics.RESURRECTIONS_PREVENTED, table="res") - before == 1


def test_delete_arriving_before_its_insert_keeps_the_key_absent(make_sink):
    sink = make_sink()
    sink.apply(changes([("-D", 7, 9, None)]), batch_id=0)
    sink.apply(changes([("+I", 7, 1, "x")]), batch_id=1)
    assert live(sink.spec.path) == {}
    assert tombstones(sink.tombstone_path) == {7: seq(9)}


def test_newer_insert_after_delete_is_applied_and_clears_the_tombstone(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    sink.apply(changes([("-D", 1, 2, None)]), batch_id=1)
    result = sink.apply(changes([("+I", 1, 3, "again")]), batch_id=2)
    assert result.upserts == 1
    assert live(sink.spec.path) == {1: ("again", seq(3))}
    assert tombstones(sink.tombstone_path) == {}
    # a change older than the re-insert is stale against the row itself
    stale = sink.apply(changes([("+U", 1, 2, "between")]), batch_id=3)
    assert live(sink.spec.path) == {1: ("again", seq(3))}
    assert (stale.stale_ignored, stale.resurrections_prevented) == (1, 0)


def test_stale_delete_older_than_the_tombstone_is_ignored(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a"), ("-D", 1, 6, None)]), batch_id=0)
    result = sink.apply(changes([("-D", 1, 4, None)]), batch_id=1)
    assert result.stale_ignored == 1
    assert tombstones(sink.tombstone_path) == {1: seq(6)}


def test_tombstones_are_read_once_then_followed_through_the_sinks_own_commits(make_sink, engine, clock):
    """The tombstone table grows with every delete until its retention. The sink reads it once and then
    applies its own tombstone MERGEs to its copy; a commit of anything else (here the expiry) makes the
    next batch read the table again. Out-of-order deletes, re-inserts and stale changes, batch after batch:
    the copy always equals the table, and both tables stay as a sink that reads the tombstones for every
    batch leaves its own."""
    rng = random.Random(7)
    sink, reference = make_sink(name="tc"), make_sink(name="ref")
    reference._keep_tombstones = lambda *_: None         # reads the tombstone table after each of its MERGEs
    reads = []
    read = sink._read_tombstones
    sink._read_tombstones = lambda: reads.append(1) or read()
    current = 0
    for batch_id in range(14):
        rows = []
        for _ in range(12):
            key, at = rng.randrange(15), rng.randrange(1, 200)
            kind = rng.choice(["+I", "+U", "-D", "-D"])
            rows.append((kind, key, at, None if kind == "-D" else f"v{at}"))
        if batch_id == 9:
            clock.advance(timedelta(days=30))     # the expiry deletes every tombstone: another commit
        sink.apply(changes(rows), batch_id=batch_id)
        reference.apply(changes(rows), batch_id=batch_id)
        on_disk = tombstones(sink.tombstone_path)
        assert on_disk == tombstones(reference.tombstone_path)
        assert live(sink.spec.path) == live(reference.spec.path)
        if sink._tomb_copy is not None and sink._tomb_copy[0] == DeltaTable(sink.tombstone_path).version():
            current += 1
            copy = sink._tomb_copy[1].to_pydict()
            assert dict(zip(copy["id"], copy["_seq"])) == on_disk
    assert tombstones(sink.tombstone_path) and live(sink.spec.path)
    if engine == "delta-rs":     # its MERGE moves the sink's log handle: the copy follows
        assert current == 12      # every batch but the first (no tombstone table yet) and the expiry's
        assert len(reads) == 2    # at the first batch with tombstones, and after the expiry


def test_replaying_a_committed_batch_is_a_no_op(make_sink):
    sink = make_sink(name="replay")
    batch = changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")])
    first = sink.apply(batch, batch_id=4)
    version = DeltaTable(sink.spec.path).version()
    before = _metric(metrics.REPLAYED_BATCHES, table="replay")

    again = sink.apply(changes([("+U", 1, 9, "must not land")]), batch_id=4)
    # a batch behind the one the table holds is no replay (Spark replays only its last batch): the
    # checkpoint is older than the table, and the batch is refused, not skipped
    with pytest.raises(SinkCommitError, match="older than the table"):
        sink.apply(changes([("+U", 2, 9, "must not land")]), batch_id=3)

    assert first.committed and not again.committed
    assert DeltaTable(sink.spec.path).version() == version == again.table_version
    assert live(sink.spec.path) == {1: ("a", seq(1)), 2: ("b", seq(1))}
    assert _metric(metrics.REPLAYED_BATCHES, table="replay") - before == 1
    assert sink.committed_batch_id() == 4


def test_replay_is_recognised_by_a_new_sink_after_restart(make_sink):
    make_sink().apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    restarted = make_sink()
    assert not restarted.apply(changes([("+U", 1, 2, "b")]), batch_id=0).committed
    assert restarted.apply(changes([("+U", 1, 2, "b")]), batch_id=1).committed
    assert live(restarted.spec.path) == {1: ("b", seq(2))}


def test_batch_that_changes_nothing_is_still_recorded(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 5, "a")]), batch_id=0)
    stale = sink.apply(changes([("+U", 1, 1, "old")]), batch_id=1)
    assert stale.committed and stale.stale_ignored == 1
    assert sink.committed_batch_id() == 1
    assert not sink.apply(changes([("+U", 1, 1, "old")]), batch_id=1).committed


def test_pipelines_have_separate_transaction_ids(make_sink, tmp_path):
    path = str(tmp_path / "shared")
    make_sink(pipeline_id="a", path=path).apply(changes([("+I", 1, 1, "a")]), batch_id=5)
    other = make_sink(pipeline_id="b", path=path)
    assert other.apply(changes([("+I", 2, 1, "b")]), batch_id=0).committed
    assert set(live(path)) == {1, 2}


def _version(path: str) -> int:
    return DeltaTable(path).version() if DeltaTable.is_deltatable(path) else -1


def _mixed_batches():
    return [
        changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b"), ("+I", 3, 1, "c")]),
        changes([("-D", 1, 4, None), ("+U", 2, 3, "b3"), ("-D", 3, 2, None), ("+I", 4, 2, "d")]),
        changes([("+U", 1, 3, "late"), ("+I", 3, 5, "c5")]),
    ]


@pytest.mark.parametrize("crash_batch", [1, 2])
def test_crash_between_tombstone_and_table_commit_then_replay_ends_like_a_clean_run(
        make_sink, tmp_path, crash_batch):
    clean = make_sink(path=str(tmp_path / "clean" / "t"))
    for batch_id, batch in enumerate(_mixed_batches()):
        clean.apply(batch, batch_id=batch_id)

    crashed_path = str(tmp_path / "crashed" / "t")
    sink = make_sink(path=crashed_path)

    class Crash(Exception):
        pass

    def crash(*args, **kwargs):
        raise Crash("process died after the tombstone commit")

    for batch_id, batch in enumerate(_mixed_batches()):
        if batch_id == crash_batch:
            tomb_version = _version(sink.tombstone_path)
            table_version = _version(crashed_path)
            sink._merge_table = crash
            with pytest.raises(SinkCommitError, match="process died"):
                sink.apply(batch, batch_id=batch_id)
            assert _version(sink.tombstone_path) > tomb_version, "the tombstone commit happened"
            assert _version(crashed_path) == table_version, "the table commit did not"
            sink = make_sink(path=crashed_path)  # restart; Spark replays the uncommitted batch
        sink.apply(batch, batch_id=batch_id)

    assert live(crashed_path) == live(clean.spec.path)
    assert tombstones(sink.tombstone_path) == tombstones(clean.tombstone_path)
    assert read_rows(sink.tombstone_path) == read_rows(clean.tombstone_path)
    assert sink.committed_batch_id() == clean.committed_batch_id() == 2


def test_new_table_has_source_schema_and_properties(make_sink):
    sink = make_sink(primary_key=("id",))
    ts = pa.array([1_700_000_000_000], pa.timestamp("ms", tz="UTC"))
    batch = changes([("+I", 1, 1, "a")], extra={"qty": pa.array([3], pa.int32())})
    batch = batch.append_column("_topic", pa.array(["orders"])).append_column("_source_ts", ts)
    sink.apply(batch, batch_id=0)
    table = DeltaTable(sink.spec.path)
    assert [f.name for f in table.schema().fields] == ["id", "v", "qty", "_seq", "_source_ts"]
    config = table.metadata().configuration
    assert json.loads(config["changelake.primaryKey"]) == ["id"]
    assert config["changelake.tombstoneTable"] == sink.tombstone_path
    row = read_rows(sink.spec.path)[0]
    assert (row["qty"], row["_source_ts"].timestamp()) == (3, 1_700_000_000.0)


def test_new_nullable_column_evolves_the_table(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")]), batch_id=0)
    sink.apply(changes([("+U", 2, 2, "b2")], extra={"price": pa.array([9.5])}), batch_id=1)
    rows = read_rows(sink.spec.path, columns="id, v, price")
    assert rows == [{"id": 1, "v": "a", "price": None}, {"id": 2, "v": "b2", "price": 9.5}]
    # a later batch without the column writes NULL: the row image has no value for it
    sink.apply(changes([("+U", 2, 3, "b3")]), batch_id=2)
    assert read_rows(sink.spec.path, columns="id, price")[1] == {"id": 2, "price": None}


def test_narrower_integer_is_widened_to_the_table_type(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a")], extra={"n": pa.array([1], pa.int64())}), batch_id=0)
    sink.apply(changes([("+I", 2, 1, "b")], extra={"n": pa.array([2], pa.int16())}), batch_id=1)
    assert [r["n"] for r in read_rows(sink.spec.path, columns="id, n")] == [1, 2]


def test_type_conflict_raises_and_says_what_to_fix(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a")], extra={"n": pa.array([1], pa.int64())}), batch_id=0)
    version = DeltaTable(sink.spec.path).version()
    with pytest.raises(SinkCommitError, match=r"'n' changed from int64 to string.*Cast"):
        sink.apply(changes([("+I", 2, 1, "b")], extra={"n": pa.array(["2"])}), batch_id=1)
    assert DeltaTable(sink.spec.path).version() == version
    assert live(sink.spec.path) == {1: ("a", seq(1))}


def test_a_wider_type_widens_the_column_keeping_rows_properties_and_transaction_ids(make_sink):
    sink = make_sink(name="wide", properties={"delta.appendOnly": "false"})
    sink.apply(changes([("+I", 1, 1, "a")], extra={"n": pa.array([1], pa.int32())}), batch_id=0)
    before = _metric(metrics.SCHEMA_CHANGES, table="wide", kind="widen_type")
    sink.apply(changes([("+I", 2, 2, "b")], extra={"n": pa.array([2**40], pa.int64())}), batch_id=1)
    table = DeltaTable(sink.spec.path)
    assert pa.schema(table.schema().to_arrow()).field("n").type == pa.int64()
    assert [r["n"] for r in read_rows(sink.spec.path, columns="id, n")] == [1, 2**40]
    assert table.metadata().configuration["delta.appendOnly"] == "false"
    assert sink.committed_batch_id() == 1
    assert _metric(metrics.SCHEMA_CHANGES, table="wide", kind="widen_type") == before + 1
    replay = sink.apply(changes([("+I", 2, 2, "b")], extra={"n": pa.array([2**40], pa.int64())}), batch_id=1)
    assert not replay.committed                               # exactly once across the rewrite


def test_evolve_drops_a_dropped_column_and_lenient_keeps_it_null(make_sink):
    for behaviour, kept in (("evolve", False), ("lenient", True)):
        sink = make_sink(name=f"drop_{behaviour}", schema_change=behaviour)
        sink.apply(changes([("+I", 1, 1, "a")], extra={"n": pa.array([1], pa.int64())}), batch_id=0)
        sink.apply(changes([("+U", 1, 2, "b")]), batch_id=1, dropped_columns=["n"])
        names = pa.schema(DeltaTable(sink.spec.path).schema().to_arrow()).names
        assert ("n" in names) == kept
        assert read_rows(sink.spec.path)[0]["v"] == "b"
        if kept:
            assert read_rows(sink.spec.path)[0]["n"] is None


def test_ignore_writes_neither_a_new_column_nor_a_wider_type(make_sink):
    sink = make_sink(name="ign", schema_change="ignore")
    sink.apply(changes([("+I", 1, 1, "a")], extra={"n": pa.array([1], pa.int32())}), batch_id=0)
    sink.apply(changes([("+I", 2, 2, "b")], extra={"n": pa.array([2], pa.int64()), "x": pa.array(["new"])}),
               batch_id=1)
    schema = pa.schema(DeltaTable(sink.spec.path).schema().to_arrow())
    assert "x" not in schema.names and schema.field("n").type == pa.int32()
    assert [r["n"] for r in read_rows(sink.spec.path, columns="id, n")] == [1, 2]


def test_null_key_raises_before_anything_is_written(make_sink):
    sink = make_sink()
    sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    bad = changes([("+I", 2, 1, "b"), ("+I", 3, 1, "c")])
    bad = bad.set_column(0, "id", pa.array([2, None], pa.int64()))
    with pytest.raises(SinkCommitError, match="1 row.*null 'id'.*dead-letter"):
        sink.apply(bad, batch_id=1)
    assert live(sink.spec.path) == {1: ("a", seq(1))}
    assert sink.committed_batch_id() == 0


def test_missing_key_column_raises(make_sink):
    sink = make_sink(primary_key=("id", "region"))
    with pytest.raises(SinkCommitError, match=r"lacks column\(s\) \['region'\]"):
        sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    assert not DeltaTable.is_deltatable(sink.spec.path)


def test_declared_key_must_match_the_table(make_sink, tmp_path):
    path = str(tmp_path / "keyed")
    make_sink(path=path).apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    other = make_sink(path=path, primary_key=("v",))
    with pytest.raises(SinkCommitError, match=r"created with primary key \['id'\].*declares \['v'\]"):
        other.apply(changes([("+I", 1, 2, "a")]), batch_id=1)


def test_two_tables_cannot_share_a_tombstone_table(make_sink, tmp_path):
    shared = str(tmp_path / "tombs")
    make_sink(name="a", tombstone_path=shared).apply(changes([("-D", 1, 1, None)]), batch_id=0)
    other = make_sink(name="b", tombstone_path=shared)
    with pytest.raises(SinkCommitError, match=r"belongs to .*/a, not to .*/b; give every sink table its own"):
        other.apply(changes([("+I", 1, 2, "x")]), batch_id=0)
    assert tombstones(shared) == {1: seq(1)}


def test_composite_key_and_quoted_column_names(make_sink, engine):
    sink = make_sink(primary_key=("Region", "order id"))
    batch = pa.table({
        "Region": ["eu", "eu", "us", "eu"], "order id": [1, 2, 1, 1], "Total Price": [1.0, 2.0, 3.0, 4.0],
        "_kind": pa.array([0, 0, 0, 2], pa.int8()), "_seq": [seq(1), seq(1), seq(1), seq(2)],
    })
    if engine.startswith("delta-spark"):    # Delta for Spark needs column mapping for a space in a name
        with pytest.raises(SinkCommitError, match=r"cannot write the column\(s\) 'order id', 'Total Price'.*delta-rs"):
            sink.apply(batch, batch_id=0)
        return
    sink.apply(batch, batch_id=0)
    rows = read_rows(sink.spec.path, columns='"Region", "order id", "Total Price"',
                     order_by='"Region", "order id"')
    assert rows == [{"Region": "eu", "order id": 1, "Total Price": 4.0},
                    {"Region": "eu", "order id": 2, "Total Price": 2.0},
                    {"Region": "us", "order id": 1, "Total Price": 3.0}]


def test_partitioned_table(make_sink):
    sink = make_sink(partition_by=("region",))
    region = {"region": pa.array(["eu", "us", "eu"])}
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b"), ("+I", 3, 1, "c")], extra=region), batch_id=0)
    # key 1 moves to another partition; key 3 is deleted
    moved = {"region": pa.array(["us", None])}
    sink.apply(changes([("+U", 1, 2, "a2"), ("-D", 3, 2, None)], extra=moved), batch_id=1)
    table = DeltaTable(sink.spec.path)
    assert table.metadata().partition_columns == ["region"]
    assert {uri.split("/")[-2] for uri in table.file_uris()} <= {"region=eu", "region=us"}
    rows = read_rows(sink.spec.path, columns="id, v, region")
    assert rows == [{"id": 1, "v": "a2", "region": "us"}, {"id": 2, "v": "b", "region": "us"}]


def test_tombstones_expire_after_retention_on_the_expiry_interval(make_sink, clock):
    sink = make_sink(tombstone_retention=timedelta(days=1), tombstone_expiry_interval=timedelta(hours=6))
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")]), batch_id=0)  # first expiry run: t0
    sink.apply(changes([("-D", 1, 2, None)]), batch_id=1)
    clock.advance(timedelta(hours=23))
    sink.apply(changes([("-D", 2, 2, None)]), batch_id=2)  # expiry due (> 6 h): nothing old enough
    assert set(tombstones(sink.tombstone_path)) == {1, 2}
    clock.advance(timedelta(hours=2))  # tombstone 1 is now 25 h old, but expiry ran 2 h ago
    sink.apply(changes([("+U", 1, 1, "late")]), batch_id=3)
    assert set(tombstones(sink.tombstone_path)) == {1, 2}
    assert live(sink.spec.path) == {}
    clock.advance(timedelta(hours=5))  # 7 h since the last run: tombstone 1 (30 h) expires, 2 (7 h) stays
    sink.apply(changes([("+I", 9, 1, "z")]), batch_id=4)
    assert set(tombstones(sink.tombstone_path)) == {2}
    # past retention the tombstone no longer guards the key: documented limit of late data
    sink.apply(changes([("+U", 1, 1, "too late")]), batch_id=5)
    assert 1 in live(sink.spec.path)


def test_expire_tombstones_on_demand(make_sink, clock):
    sink = make_sink(tombstone_retention=timedelta(hours=1))
    assert sink.expire_tombstones() == 0  # no tombstone table yet
    sink.apply(changes([("-D", 1, 2, None), ("-D", 2, 2, None)]), batch_id=0)
    assert sink.expire_tombstones(now=clock.now + timedelta(minutes=59)) == 0
    assert sink.expire_tombstones(now=clock.now + timedelta(minutes=61)) == 2
    assert tombstones(sink.tombstone_path) == {}


def test_metrics_count_applied_rows_by_kind(make_sink):
    sink = make_sink(name="metered")
    labels = [("+I",), ("+U",), ("-D",)]
    before = [_metric(metrics.ROWS_OUT, table="metered", kind=k) for (k,) in labels]
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 1, "b")]), batch_id=0)
    result = sink.apply(changes([("+U", 1, 2, "a2"), ("-D", 2, 2, None), ("+I", 3, 2, "c")]), batch_id=1)
    after = [_metric(metrics.ROWS_OUT, table="metered", kind=k) for (k,) in labels]
    assert [a - b for a, b in zip(after, before)] == [3, 1, 1]
    assert metrics.TABLE_VERSION.labels(table="metered")._value.get() == result.table_version


def test_empty_batch_creates_the_table_and_records_the_batch(make_sink):
    sink = make_sink()
    result = sink.apply(changes([]), batch_id=0)
    assert result.committed and result.upserts == 0
    assert DeltaTable.is_deltatable(sink.spec.path)
    assert sink.committed_batch_id() == 0


def test_expiry_compacts_the_tombstone_table_and_keeps_live_tombstones(make_sink):
    sink = make_sink(tombstone_expiry_interval=timedelta(days=365))
    for batch_id in range(12):
        sink.apply(changes([("-D", batch_id, 1, None)]), batch_id=batch_id)
    files_before = len(DeltaTable(sink.tombstone_path).file_uris())
    assert sink.expire_tombstones() == 0
    assert len(DeltaTable(sink.tombstone_path).file_uris()) < files_before
    assert tombstones(sink.tombstone_path) == {k: seq(1) for k in range(12)}


def test_partition_column_missing_from_the_first_batch_is_an_error(make_sink):
    sink = make_sink(partition_by=("region",))
    with pytest.raises(SinkCommitError, match=r"no column\(s\) \['region'\]; fix partition_by"):
        sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    assert not DeltaTable.is_deltatable(sink.spec.path)
