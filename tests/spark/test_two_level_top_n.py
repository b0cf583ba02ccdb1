"""Two-level Top-N on Spark computes what the in-process LocalRunner computes, and what the
single-level Top-N computes: the bucket column is Spark's ``hash`` (not DuckDB's), the level-1
Top-N runs bucketed by partition + bucket, the level-2 merge by partition (one bucket when global).
"""

from __future__ import annotations

import pytest

from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner

from .test_plan_spark import ORDERS, PRODUCTS, fold, keys, levels, local_changes, spark_changes

pytestmark = pytest.mark.spark


def top_shop(two_level: int | None) -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    orders.top_n(2, order_by=["qty desc", "order_id"], two_level=two_level, name="top_orders") \
        .to_table("top_orders", primary_key=["order_id"])
    products.top_n(1, order_by=["price desc", "id"], partition_by=["category"], rank_column="rnk",
                   two_level=two_level, name="top_products") \
        .to_table("top_products", primary_key=["category", "rnk"])
    return p


def test_two_level_top_n_on_spark_equals_local_runner_and_single_level(rocksdb, tmp_path):
    plan = top_shop(3).plan()
    assert [n.id for n in plan if n.op == "rank"] == ["top_orders_local", "top_orders",
                                                      "top_products_local", "top_products"]
    want = local_changes(plan, LocalRunner(plan))
    single_plan = top_shop(None).plan()
    single = local_changes(single_plan, LocalRunner(single_plan))
    operators: list[int] = []
    got, actions = spark_changes(rocksdb, tmp_path, plan, None, operators)
    # 6 stateful nodes, each once: the normalizes, the level-1 Top-Ns, the level-2 merges
    assert sum(n.stateful for n in plan) == 6 and operators == [levels(plan)] == [3]
    assert actions == [0, 1, 2]
    for table, key in keys(plan).items():
        assert fold(want[table], key), f"{table}: the input should leave rows in it"
        assert fold(got[table], key) == fold(want[table], key) == fold(single[table], key), table
