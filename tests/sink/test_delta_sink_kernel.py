"""The engine-neutral batch kernel: validation, reduction, tombstone split (no Delta I/O)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from changelake.connectors.delta_sink_kernel import latest_per_key, split_against_tombstones, validate_changes
from changelake.connectors.delta_sink_schema import reconcile
from changelake.errors import SinkCommitError

from .tables import changes, seq

pytestmark = pytest.mark.unit
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(table["id"].to_pylist(), table["_kind"].to_pylist(), table["_seq"].to_pylist()))


def test_reduction_keeps_the_greatest_seq_per_key_and_drops_before_images():
    batch = changes([("+I", 2, 1, "x"), ("-U", 1, 9, "old"), ("+U", 1, 9, "new"), ("+I", 1, 3, "a"),
                     ("-U", 3, 4, "only a retraction")])
    assert _rows(latest_per_key(batch, primary_key=("id",))) == [(1, 2, seq(9)), (2, 0, seq(1))]


def test_reduction_over_a_composite_key_with_a_seq_tie_keeps_the_last_row_of_the_message():
    # Rows sharing a _seq come from one message, in order: the last one is the key's final state
    # ((1, x): +U then -D; (2, x): -D then +I, as a chain of key changes in a multi-row message gives).
    batch = pa.table({"a": [1, 1, 1, 2, 2], "b": ["x", "x", "y", "x", "x"],
                      "_kind": pa.array([2, 3, 0, 3, 0], pa.int8()),
                      "_seq": [seq(5), seq(5), seq(1), seq(7), seq(7)]})
    reduced = latest_per_key(batch, primary_key=("a", "b"))
    assert sorted(zip(reduced["a"].to_pylist(), reduced["b"].to_pylist(), reduced["_kind"].to_pylist())) == [
        (1, "x", 3), (1, "y", 0), (2, "x", 0)]


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.drop_columns(["_seq"]), r"lacks column\(s\) \['_seq'\]"),
    (lambda t: t.set_column(2, "_kind", pa.array([7], pa.int8())), "unknown _kind code"),
    (lambda t: t.set_column(3, "_seq", pa.array([5], pa.int64())), "_seq must be a string column"),
    (lambda t: t.set_column(3, "_seq", pa.array([None], pa.string())), "null '_seq'"),
])
def test_validation_rejects_batches_the_sink_cannot_order(mutate, message):
    with pytest.raises(SinkCommitError, match=message):
        validate_changes(mutate(changes([("+I", 1, 1, "a")])), primary_key=("id",), table="t")


def test_split_against_tombstones():
    reduced = changes([("+U", 1, 3, "older than tomb"), ("+U", 2, 8, "newer than tomb"), ("-D", 3, 2, None),
                       ("-D", 4, 6, None), ("-D", 5, 5, None), ("+I", 6, 1, "no tomb")])
    tombs = pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()),
                      "_seq": [seq(4), seq(7), seq(3), seq(5), seq(5)]})
    split = split_against_tombstones(reduced, tombs, primary_key=("id",), now=NOW)
    # key 1 blocked, key 3 stale; key 5 equals its tombstone (a replay after a crash): still merged
    assert sorted(split.table_changes["id"].to_pylist()) == [2, 4, 5, 6]
    assert (split.resurrections_prevented, split.stale_deletes) == (1, 1)
    # tombstone 2 cleared by a newer upsert, tombstone 4 moved forward
    assert _rows(split.tombstone_changes) == [(2, 2, seq(8)), (4, 3, seq(6))]
    assert split.tombstone_changes["_deleted_at"].to_pylist() == [NOW, NOW]


def test_split_against_a_tombstone_table_larger_than_the_batch():
    reduced = changes([("+U", 3, 2, "blocked"), ("+I", 500, 9, "newer"), ("+I", 7, 1, "no tomb")])
    ids = list(range(0, 1000, 3)) + [500]  # 335 tombstones, keys 3 and 500 among them
    tombs = pa.table({"id": pa.array(ids, pa.int32()), "_seq": pa.array([seq(5)] * len(ids), pa.string_view())})
    split = split_against_tombstones(reduced, tombs, primary_key=("id",), now=NOW)
    assert sorted(split.table_changes["id"].to_pylist()) == [7, 500]
    assert split.resurrections_prevented == 1
    assert _rows(split.tombstone_changes) == [(500, 0, seq(9))]


def test_reconcile_lists_every_conflict_in_one_message():
    table = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("ts", pa.timestamp("us", tz="UTC"))])
    batch = [pa.field("id", pa.int64()), pa.field("n", pa.float64()), pa.field("ts", pa.string())]
    with pytest.raises(SinkCommitError, match="'n' changed from int32 to double.*'ts' changed from timestamp"):
        reconcile(path="/t", table_schema=table, batch_fields=batch)


def test_reconcile_adds_new_columns_as_nullable_and_accepts_timestamp_units():
    table = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    batch = [pa.field("id", pa.int32()), pa.field("ts", pa.timestamp("ms", tz="UTC")),
             pa.field("extra", pa.string(), nullable=False)]
    plan = reconcile(path="/t", table_schema=table, batch_fields=batch)
    assert [(f.name, f.nullable) for f in plan.new_fields] == [("extra", True)]
    assert plan.target_schema.names == ["id", "ts", "extra"]


def test_a_double_key_is_one_key_as_in_the_merge_nan_and_both_zeros():
    """The MERGE (DataFusion) matches NaN with NaN and -0.0 with 0.0; the reduction and the tombstone
    lookup, which compare with Arrow, must agree: before, two changes of a NaN key both survived the
    reduction, and a -0.0 key never found the tombstone of 0.0."""
    nan = float("nan")
    batch = pa.table({"k": pa.array([nan, nan, -0.0, 0.0]), "_kind": pa.array([0, 2, 0, 2], pa.int8()),
                      "_seq": [seq(1), seq(2), seq(3), seq(4)]})
    reduced = latest_per_key(batch, primary_key=("k",))
    assert sorted(reduced["_seq"].to_pylist()) == [seq(2), seq(4)]
    tombs = pa.table({"k": pa.array([0.0, nan]), "_seq": [seq(9), seq(9)]})
    split = split_against_tombstones(reduced, tombs, primary_key=("k",), now=NOW)
    assert split.table_changes.num_rows == 0 and split.resurrections_prevented == 2
