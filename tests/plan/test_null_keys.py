"""NULL keys as SQL has them: a NULL group key is one group, a NULL partition key one Top-N partition,
a join's NULL equi-key matches nothing. The planner says which table key columns may be NULL,
``explain`` shows them, and a pipeline runs such histories in-process into Delta (delta-rs) ending
equal to DuckDB's batch queries over the sources' final state."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.views import pipeline_from_config
from changelake.service.config import parse_config
from changelake.service.explain import explain

from .histories import deliver, key_histories

pytestmark = pytest.mark.unit

PRODUCTS = {"id": "bigint", "category": "string", "price": "bigint"}
ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int"}
PROMOS = {"pid": "bigint", "category": "string", "pct": "int"}


# --- the planner: which columns may be NULL ----------------------------------------------------------

def _nullable(plan) -> dict[str, tuple[str, ...]]:
    return {s.table: s.nullable_key for s in plan.sinks}


def test_group_and_partition_keys_from_nullable_columns_are_nullable_table_keys():
    p = Pipeline()
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    products.group_by("category").agg(n="count(*)", hi="max(price)", name="by_cat") \
        .to_table("by_cat", primary_key=["category"])
    products.top_n(2, order_by=["price desc"], partition_by=["category"], rank_column="rn", name="top") \
        .to_table("top", primary_key=["category", "rn"])
    products.top_n(2, order_by=["price desc"], partition_by=["category"], rank_column="rn", two_level=3,
                   name="top_two_level").to_table("top_two_level", primary_key=["category", "rn"])
    products.group_by("id").agg(n="count(*)", name="by_id").to_table("by_id", primary_key=["id"])
    by_count = products.group_by("category").agg(n="count(*)", hi="max(price)", name="counts")
    by_count.group_by("n").agg(k="count(*)", name="histogram").to_table("histogram", primary_key=["n"])
    by_count.group_by("hi").agg(k="count(*)", name="by_hi").to_table("by_hi", primary_key=["hi"])
    plan = p.plan()
    assert _nullable(plan) == {"by_cat": ("category",), "top": ("category",), "top_two_level": ("category",),
                               "by_id": (), "histogram": (), "by_hi": ("hi",)}
    assert plan["top"].not_null == {"id", "rn"}                 # the source key and the rank number
    assert plan["by_cat"].not_null == {"n"}                     # COUNT is never NULL, MAX may be


def test_filters_selects_and_joins_decide_what_may_be_null():
    p = Pipeline()
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    promos = p.source("promos", columns=PROMOS, primary_key=["pid"])
    products.filter("category IS NOT NULL AND price > 0", name="known").group_by("category") \
        .agg(n="count(*)", name="known_cat").to_table("known_cat", primary_key=["category"])
    products.filter("category IS NOT NULL OR price > 0", name="either").group_by("category") \
        .agg(n="count(*)", name="either_cat").to_table("either_cat", primary_key=["category"])
    products.select({"cat": "coalesce(category, 'none')", "up": "upper(category)", "id": "id"}, name="sel") \
        .group_by("cat", "up").agg(n="count(*)", name="sel_cat").to_table("sel_cat", primary_key=["cat", "up"])
    inner = products.join(promos, on=["category"], name="inner_j")
    inner.group_by("category", "promos_category").agg(n="count(*)", name="inner_cat") \
        .to_table("inner_cat", primary_key=["category", "promos_category"])
    left = products.join(promos, on=["category"], how="left", name="left_j")
    left.group_by("id", "pid").agg(n="count(*)", name="left_ids").to_table("left_ids", primary_key=["id", "pid"])
    products.join(promos, on=["category"], how="semi", name="semi_j").group_by("category") \
        .agg(n="count(*)", name="semi_cat").to_table("semi_cat", primary_key=["category"])
    plan = p.plan()
    assert _nullable(plan) == {"known_cat": (), "either_cat": ("category",), "sel_cat": ("up",),
                               "inner_cat": (), "left_ids": ("pid",), "semi_cat": ()}


def test_explain_shows_the_table_keys_that_may_be_null():
    p = Pipeline()
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    products.top_n(1, order_by=["price desc"], partition_by=["category"], rank_column="rn", name="top") \
        .to_table("top", primary_key=["category", "rn"])
    products.select(["id", "price"], name="prices").to_table("prices", primary_key=["id"])
    text = p.explain()
    assert "Sink(name=[sink_top], table=[top], primaryKey=[category, rn], nullableKey=[category])" in text
    assert "Sink(name=[sink_prices], table=[prices], primaryKey=[id]) " in text


def test_the_issue_config_validates_and_explains_its_nullable_keys():
    config = parse_config("""
pipeline: {id: issue11, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [shop.orders], columns: {order_id: bigint, product_id: bigint, qty: int},
     primary_key: [order_id]}
  - {name: products, topics: [shop.products], columns: {id: bigint, category: string, price: bigint},
     primary_key: [id], table: products}
views:
  - {name: enriched, join: {left: orders, right: products, on: {product_id: id}}}
  - {name: revenue, from: enriched, group_by: [category], aggregates: {revenue: "sum(price)"}}
  - {name: top, from: products, top_n: {n: 3, order_by: [price desc], partition_by: [category], rank_column: rn}}
tables:
  - {name: products, primary_key: [id]}
  - {name: revenue_by_category, from: revenue, primary_key: [category]}
  - {name: top_products, from: top, primary_key: [category, rn]}
""", environ={})
    assert _nullable(pipeline_from_config(config).plan()) == {"revenue_by_category": ("category",),
                                                              "top_products": ("category",)}
    text = explain(config)
    assert "table=[revenue_by_category], primaryKey=[category], nullableKey=[category])" in text
    assert "table=[top_products], primaryKey=[category, rn], nullableKey=[category])" in text


# --- in-process, into Delta, against DuckDB ----------------------------------------------------------

ORACLE = {
    "by_category": """SELECT p.category, count(*) AS n, sum(o.qty) AS qty
                      FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category""",
    "by_category_price": "SELECT category, price, count(*) AS n FROM products GROUP BY category, price",
    "top_per_category": """SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY category
                                                                       ORDER BY price DESC, id) AS rn
                                          FROM products) WHERE rn <= 2""",
    "promoted": """SELECT p.id, p.category, p.price, pr.pid, pr.category AS promos_category, pr.pct
                   FROM products p JOIN promos pr ON p.category = pr.category""",
}


def null_pipeline() -> Pipeline:
    p = Pipeline()
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    promos = p.source("promos", columns=PROMOS, primary_key=["pid"])
    orders.join(products, on={"product_id": "id"}, name="enriched").group_by("category") \
        .agg(n="count(*)", qty="sum(qty)", name="by_category").to_table("by_category", primary_key=["category"])
    products.group_by("category", "price").agg(n="count(*)", name="by_category_price") \
        .to_table("by_category_price", primary_key=["category", "price"])
    products.top_n(2, order_by=["price desc", "id"], partition_by=["category"], rank_column="rn", name="top2") \
        .to_table("top_per_category", primary_key=["category", "rn"])
    products.join(promos, on=["category"], name="promoted").to_table("promoted", primary_key=["id", "pid"])
    return p


PLAN = null_pipeline().plan()
SOURCES = {"products": PRODUCTS, "orders": ORDERS, "promos": PROMOS}


def _changelog(source: str, rows: list) -> pa.Table:
    schema = PLAN[source].schema
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in schema]
    return pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)]
                                + [pa.array([k for k, _ in rows], pa.int8())], names=schema.names + [KIND])


def _open_sinks(root: Path) -> dict:
    return {s.table: open_sink(TableSpec(name=s.table, path=str(root / s.table), primary_key=s.primary_key,
                                         nullable_key=s.nullable_key), pipeline_id="nulls", engine="delta-rs")
            for s in PLAN.sinks}


def run(batches: list[dict], root: Path, crash: tuple[int, int] | None) -> None:
    """As ``test_property.run``: ``crash=(batch, commits)`` restarts from the last state snapshot
    after that many of the batch's table commits, and replays the batch."""
    runner, sinks = LocalRunner(PLAN), _open_sinks(root)
    checkpoint, b = runner.snapshot(), 0
    while b < len(batches):
        outs = runner.step(batches[b])
        for i, (table, changes) in enumerate(sorted(outs.items())):
            if crash == (b, i):
                break
            sink = sinks[table]
            sink.apply(sink_changes(changes, primary_key=sink.spec.primary_key, batch_id=b), batch_id=b)
        else:
            checkpoint, b = runner.snapshot(), b + 1
            continue
        crash = None
        runner, sinks = LocalRunner(PLAN), _open_sinks(root)
        runner.restore(checkpoint)


def table_rows(root: Path, table: str) -> set[tuple]:
    path = root / table
    if not (path / "_delta_log").exists():
        return set()
    return {tuple(r.values()) for r in read_delta(str(path), columns=PLAN[f"sink_{table}"].schema.names).to_pylist()}


def oracle_rows(final: dict[str, dict]) -> dict[str, set[tuple]]:
    con = duckdb.connect()
    for source, rows in final.items():
        con.register(source, _changelog(source, [(0, r) for r in rows.values()]).drop_columns([KIND]))
    out = {t: {tuple(r) for r in con.sql(q).fetchall()} for t, q in ORACLE.items()}
    con.close()
    return out


category = st.sampled_from(["a", "b", None])
product_op = st.tuples(st.integers(1, 5), category, st.integers(1, 3), st.booleans())
order_op = st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 4), st.booleans())
promo_op = st.tuples(st.integers(1, 3), category, st.integers(1, 9), st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(products=st.lists(product_op, max_size=14), orders=st.lists(order_op, max_size=10),
       promos=st.lists(promo_op, max_size=6), rnd=st.randoms(use_true_random=False), data=st.data())
def test_null_keys_end_equal_to_sql_over_the_final_state(tmp_path_factory, products, orders, promos, rnd, data):
    histories = {name: key_histories(ops, name) for name, ops in
                 (("products", products), ("orders", orders), ("promos", promos))}
    delivered = deliver({(name, k): msgs for name, (per_key, _) in histories.items() for k, msgs in per_key.items()},
                        rnd)
    batches, i = [], 0
    while i < len(delivered):
        n = rnd.randint(1, 8)
        rows = [r for msg in delivered[i:i + n] for r in msg]
        batches.append({s: _changelog(s, [(k, r) for t, k, r in rows if t == s]) for s in SOURCES})
        i += n
    crash = None
    if batches and data.draw(st.booleans(), label="crash"):
        crash = (data.draw(st.integers(0, len(batches) - 1), label="crash batch"),
                 data.draw(st.integers(0, len(PLAN.sinks) - 1), label="tables committed before the crash"))
    root = tmp_path_factory.mktemp("lake")
    run(batches, root, crash)
    expected = oracle_rows({name: final for name, (_, final) in histories.items()})
    for table in ORACLE:
        assert table_rows(root, table) == expected[table], table


def test_a_null_group_and_partition_example_step_by_step(tmp_path):
    """One explicit history: the NULL group appears, is updated, moves rows and disappears."""
    rnd = random.Random(0)
    products = [(1, None, 5, False), (2, None, 7, False), (3, "a", 1, False), (2, "a", 7, False),
                (1, None, 9, False), (1, None, 9, True), (4, None, 2, False)]
    per_key, final = key_histories(products, "products")
    batches = [{"products": _changelog("products", [(k, r) for msg in [m] for _, k, r in msg])}
               for m in deliver(per_key, rnd)]
    run(batches, tmp_path, None)
    assert table_rows(tmp_path, "top_per_category") == {(4, None, 2, 1), (2, "a", 7, 1), (3, "a", 1, 2)}
    assert table_rows(tmp_path, "by_category_price") == {(None, 2, 1), ("a", 7, 1), ("a", 1, 1)}
    assert oracle_rows({"products": final, "orders": {}, "promos": {}})["top_per_category"] == \
        table_rows(tmp_path, "top_per_category")
