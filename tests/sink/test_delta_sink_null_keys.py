"""NULL key values, as SQL has them, in tables whose key columns may be NULL (``TableSpec.nullable_key``):
a NULL group key is one key; the reduction, the tombstones and the MERGE match NULL with NULL."""

from __future__ import annotations

import datetime as dt
import decimal
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.connectors.delta_sink_kernel import latest_per_key, split_against_tombstones, validate_changes
from changelake.connectors.delta_sink_merge import (
    backtick,
    datafusion_null_safe_equal,
    double_quote,
    key_predicate,
    spark_null_safe_equal,
)
from changelake.errors import ConfigError, SinkCommitError

from .conftest import ENGINES, engine_fixture
from .tables import KIND_CODES, read_rows, seq

engine = engine_fixture(ENGINES)   # both delta-spark forms (conftest.py, DEFAULT_FORMS)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
KEY = ("category", "rn")


def ranked(rows) -> pa.Table:
    """A changelog of a Top-N table keyed by (category, rn) from ``(kind, category, rn, seq, v)``."""
    rows = list(rows)
    return pa.table({
        "category": pa.array([r[1] for r in rows], pa.string()),
        "rn": pa.array([r[2] for r in rows], pa.int64()),
        "v": pa.array([r[4] for r in rows], pa.string()),
        "_kind": pa.array([int(KIND_CODES[r[0]]) for r in rows], pa.int8()),
        "_seq": pa.array([seq(r[3]) for r in rows], pa.string()),
    })


def _keyed(table: pa.Table, *columns: str) -> list[tuple]:
    return sorted((tuple(r[c] for c in columns) for r in table.to_pylist()),
                  key=lambda t: tuple((v is None, v) for v in t))


# --- the engine-neutral kernel ------------------------------------------------------------------

@pytest.mark.unit
def test_validation_accepts_null_only_in_the_nullable_key_columns():
    batch = ranked([("+I", None, 1, 1, "x")])
    assert validate_changes(batch, primary_key=KEY, table="t", nullable_key=("category",)).num_rows == 1
    with pytest.raises(SinkCommitError, match="1 row.* null 'category'.*dead-letter"):
        validate_changes(batch, primary_key=KEY, table="t")             # a mirrored table's key
    with pytest.raises(SinkCommitError, match="null 'rn'"):
        validate_changes(ranked([("+I", "a", None, 1, "x")]), primary_key=KEY, table="t", nullable_key=("category",))


@pytest.mark.unit
def test_reduction_treats_null_as_one_key_value():
    batch = ranked([("+I", None, 1, 1, "n1"), ("+U", None, 1, 4, "n1 newest"), ("+I", None, 2, 2, "n2"),
                    ("+I", "a", 1, 3, "a1"), ("-D", None, 2, 5, None), ("+U", "a", 1, 2, "a1 older"),
                    ("-U", None, 1, 6, "a retraction")])
    reduced = latest_per_key(batch, primary_key=KEY)
    assert _keyed(reduced, "category", "rn", "v", "_kind") == [
        ("a", 1, "a1", 0), (None, 1, "n1 newest", 2), (None, 2, None, 3)]


@pytest.mark.unit
def test_tombstones_of_null_keys_are_found():
    reduced = ranked([("+U", None, 1, 3, "older than its tomb"), ("+U", None, 2, 8, "newer than its tomb"),
                      ("+I", "a", 1, 1, "no tomb: a NULL tomb is not 'a'"), ("-D", None, 3, 2, None)])
    tombs = pa.table({"category": pa.array([None, None, None, "b"], pa.string()),
                      "rn": pa.array([1, 2, 3, 1], pa.int64()),
                      "_seq": [seq(4), seq(7), seq(6), seq(1)]})
    split = split_against_tombstones(reduced, tombs, primary_key=KEY, now=NOW)
    assert _keyed(split.table_changes, "category", "rn") == [("a", 1), (None, 2)]
    assert (split.resurrections_prevented, split.stale_deletes) == (1, 1)
    assert _keyed(split.tombstone_changes, "category", "rn", "_kind") == [(None, 2, 2)]   # cleared by the newer +U


@pytest.mark.unit
def test_tombstones_of_null_keys_are_found_in_a_tombstone_table_larger_than_the_batch():
    reduced = ranked([("+I", None, 5, 2, "blocked"), ("+I", "x", 5, 9, "no tomb")])
    cats = [None if i % 2 else f"c{i}" for i in range(40)]
    tombs = pa.table({"category": pa.array(cats, pa.string()), "rn": pa.array(range(40), pa.int64()),
                      "_seq": [seq(5)] * 40})
    split = split_against_tombstones(reduced, tombs, primary_key=KEY, now=NOW)
    assert _keyed(split.table_changes, "category", "rn") == [("x", 5)]
    assert split.resurrections_prevented == 1


@pytest.mark.unit
def test_tombstones_when_every_key_value_is_null():
    reduced = ranked([("+I", None, 1, 2, "older"), ("+I", None, 1, 2, "dup")]).slice(0, 1)
    tombs = pa.table({"category": pa.nulls(1, pa.string()), "rn": pa.array([1], pa.int64()), "_seq": [seq(3)]})
    assert split_against_tombstones(reduced, tombs, primary_key=KEY, now=NOW).resurrections_prevented == 1


@pytest.mark.unit
def test_merge_condition_is_null_safe_only_for_the_nullable_columns():
    nullable = {"category": pa.string()}
    assert key_predicate(KEY, backtick, nullable=nullable, null_safe_equal=spark_null_safe_equal) == \
        "t.`category` <=> s.`category` AND t.`rn` = s.`rn`"
    # delta-rs: no IS NOT DISTINCT FROM, which it runs as a nested-loop join
    assert key_predicate(KEY, double_quote, nullable=nullable, null_safe_equal=datafusion_null_safe_equal) == (
        """coalesce(t."category", '') = coalesce(s."category", '') """
        'AND (t."category" IS NULL) = (s."category" IS NULL) AND t."rn" = s."rn"')
    assert key_predicate(KEY, double_quote) == 't."category" = s."category" AND t."rn" = s."rn"'
    with pytest.raises(ValueError, match="null_safe_equal"):
        key_predicate(KEY, double_quote, nullable=nullable)


@pytest.mark.unit
def test_nullable_key_must_be_part_of_the_primary_key():
    with pytest.raises(ConfigError, match=r"nullable_key names column\(s\) \['v'\] outside the primary key"):
        TableSpec(name="t", path="/tmp/t", primary_key=KEY, nullable_key=("v",))
    assert TableSpec(name="t", path="/tmp/t", primary_key=KEY, nullable_key=["category"]).nullable_key == ("category",)


# --- on every engine present ----------------------------------------------------------------------

def _live(path: str) -> dict[tuple, tuple]:
    rows = read_rows(path, columns='category, rn, v, "_seq"', order_by="category NULLS FIRST, rn")
    return {(r["category"], r["rn"]): (r["v"], r["_seq"]) for r in rows}


def _tombs(path: str) -> dict[tuple, str]:
    rows = read_rows(path, columns='category, rn, "_seq"', order_by="category NULLS FIRST, rn")
    return {(r["category"], r["rn"]): r["_seq"] for r in rows}


def test_null_group_key_is_inserted_updated_and_deleted(make_sink):
    sink = make_sink(name="topn", primary_key=KEY, nullable_key=("category",))
    sink.apply(ranked([("+I", None, 1, 1, "n1"), ("+I", None, 2, 1, "n2"), ("+I", "a", 1, 1, "a1")]), batch_id=0)
    assert _live(sink.spec.path) == {(None, 1): ("n1", seq(1)), (None, 2): ("n2", seq(1)), ("a", 1): ("a1", seq(1))}

    updated = sink.apply(ranked([("+U", None, 1, 2, "n1'"), ("+U", "a", 1, 2, "a1'")]), batch_id=1)
    assert (updated.upserts, updated.stale_ignored) == (2, 0)          # updated in place, not inserted again
    assert _live(sink.spec.path) == {(None, 1): ("n1'", seq(2)), (None, 2): ("n2", seq(1)), ("a", 1): ("a1'", seq(2))}

    deleted = sink.apply(ranked([("-D", None, 2, 3, "n2")]), batch_id=2)
    assert deleted.deletes == 1
    assert _live(sink.spec.path) == {(None, 1): ("n1'", seq(2)), ("a", 1): ("a1'", seq(2))}
    assert _tombs(sink.tombstone_path) == {(None, 2): seq(3)}

    # a late, older change of the deleted NULL key must not resurrect it; another key is untouched
    late = sink.apply(ranked([("+U", None, 2, 2, "late"), ("+U", "a", 2, 2, "new a2")]), batch_id=3)
    assert (late.resurrections_prevented, late.upserts) == (1, 1)
    assert _live(sink.spec.path) == {(None, 1): ("n1'", seq(2)), ("a", 1): ("a1'", seq(2)),
                                     ("a", 2): ("new a2", seq(2))}

    # a delete older than the NULL key's row leaves it; a newer re-insert clears the deleted key's tombstone
    assert sink.apply(ranked([("-D", None, 1, 1, None)]), batch_id=4).deletes == 0
    again = sink.apply(ranked([("+I", None, 2, 4, "back")]), batch_id=5)
    assert again.upserts == 1 and (None, 2) not in _tombs(sink.tombstone_path)
    assert _live(sink.spec.path) == {(None, 1): ("n1'", seq(2)), (None, 2): ("back", seq(4)),
                                     ("a", 1): ("a1'", seq(2)), ("a", 2): ("new a2", seq(2))}


def test_a_key_that_is_only_a_nullable_column(make_sink):
    sink = make_sink(name="by_cat", primary_key=("category",), nullable_key=("category",))
    batch = pa.table({"category": pa.array([None, "a", None], pa.string()), "n": pa.array([1, 1, 2], pa.int64()),
                      "_kind": pa.array([0, 0, 2], pa.int8()), "_seq": [seq(1), seq(1), seq(2)]})
    sink.apply(batch, batch_id=0)
    sink.apply(batch.slice(2, 1).set_column(2, "_kind", pa.array([3], pa.int8()))
               .set_column(3, "_seq", pa.array([seq(3)])), batch_id=1)
    rows = read_rows(sink.spec.path, columns="category, n", order_by="category NULLS FIRST")
    assert rows == [{"category": "a", "n": 1}]
    assert read_rows(sink.tombstone_path, columns='category, "_seq"', order_by="category") == [
        {"category": None, "_seq": seq(3)}]


def test_a_mirrored_table_still_rejects_a_null_key(make_sink):
    sink = make_sink(name="mirror", primary_key=KEY)
    with pytest.raises(SinkCommitError, match="null 'category'"):
        sink.apply(ranked([("+I", None, 1, 1, "x")]), batch_id=0)
    assert sink.table_version() is None


# --- delta-rs: the constant each key type is compared with ------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("type_, value", [
    (pa.int8(), 3), (pa.int32(), 3), (pa.int64(), 0), (pa.float64(), 1.5), (pa.decimal128(10, 2), decimal.Decimal(0)),
    (pa.string(), ""), (pa.binary(), b"x"), (pa.bool_(), False), (pa.date32(), dt.date(1970, 1, 1)),
    (pa.timestamp("us", tz="UTC"), datetime(1970, 1, 1, tzinfo=timezone.utc)),
    (pa.timestamp("us"), dt.datetime(2020, 1, 2)),
], ids=str)
def test_delta_rs_matches_a_null_key_and_the_value_it_is_filled_with_apart(tmp_path, clock, type_, value):
    spec = TableSpec(name="typed", path=str(tmp_path / "typed"), primary_key=("k",), nullable_key=("k",))
    sink = open_sink(spec, pipeline_id="p", engine="delta-rs", clock=clock)

    def batch(kind: int, n: int, s: int) -> pa.Table:
        return pa.table({"k": pa.array([None, value], type_), "n": pa.array([n, n + 1], pa.int64()),
                         "_kind": pa.array([kind, kind], pa.int8()), "_seq": [seq(s), seq(s)]})

    sink.apply(batch(0, 1, 1), batch_id=0)
    result = sink.apply(batch(2, 10, 2), batch_id=1)
    assert (result.upserts, result.stale_ignored) == (2, 0)
    rows = read_rows(spec.path, columns="k, n", order_by="n")
    assert [(r["k"] is None, r["n"]) for r in rows] == [(True, 10), (False, 11)]
    assert sink.apply(batch(3, 0, 3), batch_id=2).deletes == 2
    assert read_rows(spec.path, columns="k", order_by="k") == []


def test_a_table_partitioned_by_its_nullable_key_column(make_sink):
    sink = make_sink(name="parted", primary_key=KEY, nullable_key=("category",), partition_by=("category",))
    sink.apply(ranked([("+I", None, 1, 1, "n1"), ("+I", "a", 1, 1, "a1")]), batch_id=0)
    sink.apply(ranked([("+U", None, 1, 2, "n1'"), ("-D", "a", 1, 2, None)]), batch_id=1)
    sink.apply(ranked([("+U", "a", 1, 1, "late")]), batch_id=2)
    assert _live(sink.spec.path) == {(None, 1): ("n1'", seq(2))}
    assert _tombs(sink.tombstone_path) == {("a", 1): seq(2)}
