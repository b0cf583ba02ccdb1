"""The chain's group numbering: state buckets spread evenly over Spark's shuffle partitions.

Spark sends an operator's group ``g`` to partition ``pmod(hash(g), P)``; the layout picks group numbers
so that bucket ``b`` lands in partition ``b mod P`` and the pass-through envelopes in every partition.
The partitions are read back from a real Spark repartition by ``g`` (the partitioning of a stateful
operator's input), so a change in Spark's hash would fail here, not silently unbalance the operators.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from changelake.spark.groups import MARKER, GroupLayout, checkpoint_layout, spark_hash_int


@pytest.mark.spark
@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7])
def test_bucket_b_runs_in_partition_b_mod_p_and_pass_through_groups_cover_every_partition(spark, partitions):
    layout = GroupLayout(partitions)
    buckets = 64
    groups = [layout.state_group(b) for b in range(buckets)]
    passing = sorted({int(g) for g in layout.next_group(np.full(50, -2), np.arange(50), 0)})
    frame = spark.createDataFrame([(g,) for g in groups + passing], "g int")
    placed = {r.g: r.p for r in frame.repartition(partitions, "g").selectExpr("g", "spark_partition_id() AS p")
              .collect()}
    assert [placed[g] for g in groups] == [b % partitions for b in range(buckets)]
    assert sorted(placed[g] for g in passing) == list(range(partitions))


@pytest.mark.spark
def test_the_hash_is_sparks_at_the_int_limits(spark):
    values = [0, 1, -1, 42, 2**31 - 1, -2**31, 123_456_789, -987_654_321]
    rows = spark.sql("SELECT v, hash(v) AS h FROM VALUES " + ", ".join(f"(CAST({v} AS INT))" for v in values)
                     + " AS t(v)").collect()
    assert {r.v: r.h for r in rows} == {v: spark_hash_int(v) for v in values}


@pytest.mark.unit
@pytest.mark.parametrize("partitions", [None, 1, 2, 5])
def test_a_layout_is_one_to_one_keeps_its_numbers_as_buckets_grow_and_survives_pickling(partitions):
    small, large = GroupLayout(partitions, 8), GroupLayout(partitions, 200)
    groups = [large.state_group(b) for b in range(200)]
    assert len(set(groups)) == 200 and min(groups) >= 0
    assert [small.state_group(b) for b in range(200)] == groups        # grows on demand, same numbers
    assert [large.bucket(g) for g in groups] == list(range(200))
    copy = pickle.loads(pickle.dumps(large))
    assert copy == large and copy.per_level == (partitions is not None)
    target, bucket = np.array([0, 1, 0, -2, 3]), np.array([5, 7, 199, 3, 0])
    assert np.array_equal(copy.next_group(target, bucket, 0), large.next_group(target, bucket, 0))
    g = large.next_group(target, bucket, 0)
    assert list(g[[0, 2]]) == [groups[5], groups[199]] and (g[[1, 3, 4]] < 0).all()


@pytest.mark.unit
def test_the_legacy_layout_is_the_old_numbering():
    layout = GroupLayout.legacy()
    target, bucket = np.array([1, 0, 0, -2, 9]), np.array([4, 4, 31, 3, 0])
    assert list(layout.next_group(target, bucket, 1)) == [4, -1, -2, -2, -1]
    assert layout.bucket(17) == 17


@pytest.mark.unit
def test_the_checkpoint_records_its_layout(tmp_path):
    new = tmp_path / "new"
    assert checkpoint_layout(str(new), 3) == GroupLayout(3)
    assert json.loads((new / MARKER).read_text()) == {"layout": "balanced", "partitions": 3, "stages": "level"}
    assert checkpoint_layout(str(new), 8) == GroupLayout(3)          # the session's count no longer matters
    assert checkpoint_layout(str(new), 8).per_level

    per_node = tmp_path / "per-node"                                 # recorded before per-level operators
    (per_node / MARKER).parent.mkdir(parents=True)
    (per_node / MARKER).write_text(json.dumps({"layout": "balanced", "partitions": 2}))
    assert checkpoint_layout(str(per_node), 4) == GroupLayout(2, per_level=False)
    assert not checkpoint_layout(str(per_node), 4).per_level

    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n{}\n")
    assert checkpoint_layout(str(old), 2) == GroupLayout.legacy()   # written before layouts existed
    assert checkpoint_layout(str(old), 2) == GroupLayout.legacy()
    assert json.loads((old / MARKER).read_text())["layout"] == "legacy"

    future = tmp_path / "future"
    (future / MARKER).parent.mkdir(parents=True)
    (future / MARKER).write_text(json.dumps({"layout": "striped", "partitions": 2}))
    with pytest.raises(ValueError, match="newer changelake"):
        checkpoint_layout(str(future), 2)
    (future / MARKER).write_text(json.dumps({"layout": "balanced", "partitions": 2, "stages": "fused"}))
    with pytest.raises(ValueError, match="newer changelake"):
        checkpoint_layout(str(future), 2)
