"""A view written in SQL (join + aggregate + Top-N) runs on Spark as its step form does: the same
plan, and the same table changes as the step form in the in-process runner."""

from __future__ import annotations

import pytest

from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner

from .test_plan_spark import ORDERS, PRODUCTS, fold, keys, local_changes, spark_changes

pytestmark = pytest.mark.spark

QUERY = """
WITH sales AS (
  SELECT p.category, COUNT(*) AS orders, SUM(o.qty * p.price) AS revenue
  FROM orders o JOIN products p ON o.product_id = p.id
  GROUP BY p.category)
SELECT category, revenue, rnk FROM (
  SELECT *, ROW_NUMBER() OVER (ORDER BY revenue DESC, category) AS rnk FROM sales)
WHERE rnk <= 2
"""


def sources() -> Pipeline:
    p = Pipeline()
    p.source("orders", columns=ORDERS, primary_key=["order_id"])
    p.source("products", columns=PRODUCTS, primary_key=["id"])
    return p


def test_a_sql_view_on_spark_equals_its_step_form(rocksdb, tmp_path):
    written = sources()
    written.sql("top_categories", QUERY).to_table("top_categories", primary_key=["rnk"])
    steps = sources()
    steps.stream("orders").join(steps.stream("products"), on={"product_id": "id"}, name="top_categories_join") \
        .select({"category": "category", "revenue_arg": "qty * price"}, name="top_categories_pre") \
        .group_by("category").agg(orders="count(*)", revenue="sum(revenue_arg)", name="top_categories_group_by") \
        .top_n(2, order_by=["revenue desc", "category"], rank_column="rnk", name="top_categories_top_n") \
        .select(["category", "revenue", "rnk"], name="top_categories") \
        .to_table("top_categories", primary_key=["rnk"])
    assert written.explain() == steps.explain()
    plan = written.plan()
    step_plan = steps.plan()
    want = local_changes(step_plan, LocalRunner(step_plan))
    got, _ = spark_changes(rocksdb, tmp_path, plan, None)
    key = keys(plan)["top_categories"]
    assert fold(want["top_categories"], key), "the input should leave rows in the table"
    assert fold(got["top_categories"], key) == fold(want["top_categories"], key)
