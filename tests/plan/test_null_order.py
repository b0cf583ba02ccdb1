"""Top-N over a nullable column ranks NULLs as Flink does when the query says nothing: first ascending,
last descending (Flink's planner: NullCollation.LOW), in SQL views and in the step form alike; an explicit
NULLS FIRST / LAST still wins. The expected rankings are written out by hand from that rule."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import KIND
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.types import arrow_schema

pytestmark = pytest.mark.unit

PRODUCTS = {"id": "bigint", "category": "string", "price": "double"}
ROWS = [(1, "a", 5.0), (2, "a", None), (3, "a", 1.0), (4, "a", 9.0), (5, "b", None), (6, "b", None),
        (7, "b", 3.0), (8, "b", 2.0)]


def top2(order: str, *, sql: bool) -> set[tuple]:
    """(category, rank, id) of a Top-2 per category ordered by ``order`` then id."""
    p = Pipeline()
    p.source("products", columns=PRODUCTS, primary_key=["id"])
    if sql:
        p.sql("top", f"""SELECT category, rn, id FROM (
                           SELECT *, ROW_NUMBER() OVER (PARTITION BY category ORDER BY {order}, id) AS rn
                           FROM products) t WHERE rn <= 2""").to_table("top", primary_key=["category", "rn"])
    else:
        p.stream("products").top_n(2, order_by=[order, "id"], partition_by=["category"], rank_column="rn",
                                   name="ranked").select(["category", "rn", "id"], name="top") \
            .to_table("top", primary_key=["category", "rn"])
    schema = arrow_schema(PRODUCTS)
    batch = pa.Table.from_arrays([pa.array([r[i] for r in ROWS], type=f.type) for i, f in enumerate(schema)]
                                 + [pa.array([0] * len(ROWS), pa.int8())], names=schema.names + [KIND])
    changes = LocalRunner(p.plan()).step({"products": batch})["top"].to_pylist()
    table: dict[tuple, int] = {}
    for row in changes:                              # the upsert sink's rule: the last change per key wins
        key = (row["category"], row["rn"])
        if row[KIND] in (0, 2):
            table[key] = row["id"]
        else:
            table.pop(key, None)
    return {(c, rn, i) for (c, rn), i in table.items()}


@pytest.mark.parametrize("sql", [True, False], ids=["sql", "step"])
def test_top_n_ranks_nulls_as_flink_by_default(sql):
    # ascending: NULLs first
    assert top2("price", sql=sql) == {("a", 1, 2), ("a", 2, 3), ("b", 1, 5), ("b", 2, 6)}
    assert top2("price ASC" if sql else "price asc", sql=sql) == top2("price", sql=sql)
    # descending: NULLs last
    assert top2("price DESC" if sql else "price desc", sql=sql) == {("a", 1, 4), ("a", 2, 1), ("b", 1, 7),
                                                                      ("b", 2, 8)}


@pytest.mark.parametrize("sql", [True, False], ids=["sql", "step"])
def test_an_explicit_null_order_wins(sql):
    assert top2("price ASC NULLS LAST" if sql else "price asc nulls last", sql=sql) == \
        {("a", 1, 3), ("a", 2, 1), ("b", 1, 8), ("b", 2, 7)}
    assert top2("price DESC NULLS FIRST" if sql else "price desc nulls first", sql=sql) == \
        {("a", 1, 2), ("a", 2, 4), ("b", 1, 5), ("b", 2, 6)}


def test_an_unsupported_function_is_named_as_the_query_writes_it():
    from changelake.plan.sql_view import check_query

    errors = check_query("SELECT id, POSITION('x' IN category) AS p, upper(LOCATE('y', category)) AS q FROM t")
    assert [e.split(" is not supported")[0] for e in errors] == ["the function POSITION()", "the function LOCATE()"]
    assert "STR_POSITION" not in " ".join(errors)
