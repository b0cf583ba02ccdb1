"""Two-phase (local-global) aggregation on the Spark executor.

An aggregate whose calls merge runs two-phase: the router in front of it folds the rows it sends
into one partial accumulator per group key, the bucketed global kernel merges them; one with a DISTINCT call stays
one-phase. Over three micro-batches with retractions (a category emptied by a move, re-delivered
changes), the tables and the per-key changes equal the in-process LocalRunner's.
"""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from changelake.operators.group_aggregate import (EncodedGlobalGroupAggregate, GroupAggregate,
                                                  GroupAggregateConfig, AggCall, encode_partial, local_partials)
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.spark.chain import Chain
from changelake.spark.compile import is_two_phase
from tests.spark.test_plan_spark import ORDERS, PRODUCTS, fold, keys, levels, local_changes, spark_changes

pytestmark = pytest.mark.spark


def catalog() -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    # COUNT/SUM take the vectorised local fold, MAX the row loop: both two-phase
    products.group_by("category").agg(n="count(*)", total="sum(price)", top="max(price)", name="by_category") \
        .to_table("category_stats", primary_key=["category"])
    # DISTINCT cannot merge: one-phase
    orders.group_by("product_id").agg(buyers="count(distinct order_id)", qty="sum(qty)", name="by_product") \
        .to_table("product_stats", primary_key=["product_id"])
    return p


def test_aggregate_compiles_two_phase_unless_distinct():
    plan = catalog().plan()
    nodes = {n.id: n for n in plan if n.op == "aggregate"}
    assert is_two_phase(nodes["by_category"]) and not is_two_phase(nodes["by_product"])
    assert not is_two_phase(catalog().plan(mini_batch=False).by_id["by_category"])
    # the router in front of by_category folds its rows into partials; by_product gets the rows
    chain = Chain.of(plan, 3, 32, two_phase=True)
    assert chain.two_phase == {"by_category"}
    assert chain.side_schema(nodes["by_category"], 0).names == ["category", "partial", "_kind", "_seq"]
    assert chain.side_schema(nodes["by_product"], 0).names == [*ORDERS, "_kind", "_seq"]
    assert Chain.of(plan, 3, 32, two_phase=False).two_phase == frozenset()


def test_local_then_global_equals_one_phase():
    """Without Spark: local partials of two batches (as two tasks) merged globally = GroupAggregate."""
    cfg = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("count"), AggCall("sum", 1), AggCall("max", 1)),
                               mini_batch_size=100)
    batches = [pa.table({"k": ["a", "b", "a", None], "v": pa.array([1, 2, 3, 4], pa.int64()),
                         "_kind": pa.array([0, 0, 0, 0], pa.int8())}),
               pa.table({"k": ["a", "b", "a"], "v": pa.array([1, 2, None], pa.int64()),
                         "_kind": pa.array([3, 3, 0], pa.int8())})]
    one, glob = GroupAggregate(cfg), EncodedGlobalGroupAggregate(cfg)
    for batch in batches:
        want = one.process(batch)
        want.extend(one.finish())
        partials, first = local_partials(batch, cfg)
        rows = pa.table({"k": batch["k"].take(pa.array(first)), "partial": [encode_partial(p) for p in partials],
                         "_kind": pa.array([0] * len(first), pa.int8())})
        got = glob.process(rows)
        got.extend(glob.finish())
        assert sorted(got, key=repr) == sorted(want, key=repr)
        # the state is the one-phase kernel's: a snapshot of either continues in the other
        glob = EncodedGlobalGroupAggregate.restore(cfg, one.snapshot())
    assert glob.state_rows == one.state_rows == 2


def test_two_phase_equals_local_runner(rocksdb, tmp_path):
    plan = catalog().plan()
    want = local_changes(plan, LocalRunner(plan))
    operators: list[int] = []
    got, actions = spark_changes(rocksdb, tmp_path, plan, None, operators)
    # 4 stateful nodes, each once: the normalizes, then both aggregates
    assert sum(n.stateful for n in plan) == 4 and operators == [levels(plan)] == [2]
    assert actions == [0, 1, 2]
    for table, key in keys(plan).items():
        assert fold(got[table], key) == fold(want[table], key), table
    per_key = collections.defaultdict(lambda: collections.defaultdict(list))
    for who, changes in (("spark", got), ("local", want)):
        for kind, row in changes["category_stats"]:
            per_key[who][row["category"]].append((kind, row))
    assert per_key["spark"] == per_key["local"]
    # "tools" is emptied in batch 2 (product 3 moves to garden): the aggregate deletes it
    assert per_key["spark"]["tools"][-1][0] == 3
    assert ("tools",) not in fold(got["category_stats"], ["category"])
    assert fold(got["category_stats"], ["category"])[("garden",)] == {"category": "garden", "n": 1, "total": 6, "top": 6}
