"""Property: random CDC histories of two related tables, delivered in random micro-batches with
per-key order kept but keys interleaved, at-least-once re-deliveries and a crash with replay,
through normalize + join + group aggregate + top-n (and a left join and a materialized sink) into
Delta tables, end equal to the same queries run in batch by DuckDB over the sources' final state.

The plan runs in-process (:class:`LocalRunner`), so many histories fit in the test budget; the
Spark executor is held to the in-process runner's output by the Spark tests.
"""

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

from .histories import deliver, key_histories

pytestmark = pytest.mark.unit

PRODUCTS = {"id": "bigint", "category": "string", "price": "bigint"}
ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int"}
KEYS = {"products": "id", "orders": "order_id"}

ORACLE = {
    "enriched_orders": ("order_id", """
        SELECT o.order_id, o.product_id, o.qty, p.id, p.category, p.price
        FROM orders o JOIN products p ON o.product_id = p.id"""),
    "category_stats": ("category", """
        SELECT p.category, count(*) AS n, sum(o.qty) AS qty, max(p.price) AS hi
        FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category"""),
    "top_categories": ("rnk", """
        SELECT * FROM (
          SELECT category, n, qty, hi, row_number() OVER (ORDER BY qty DESC, category ASC) AS rnk
          FROM (SELECT p.category, count(*) AS n, sum(o.qty) AS qty, max(p.price) AS hi
                FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category))
        WHERE rnk <= 2"""),
    "category_upper": ("cat", """
        SELECT upper(p.category) AS cat, count(*) AS n
        FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category"""),
    "product_units": ("id", """
        SELECT p.id, p.category, p.price, u.product_id, u.units
        FROM products p LEFT JOIN (SELECT product_id, sum(qty) AS units FROM orders GROUP BY product_id) u
          ON p.id = u.product_id"""),
}


def shop_pipeline() -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    enriched = orders.join(products, on={"product_id": "id"}, name="enriched")
    enriched.to_table("enriched_orders", primary_key=["order_id"])
    stats = enriched.group_by("category").agg(n="count(*)", qty="sum(qty)", hi="max(price)", name="stats")
    stats.to_table("category_stats", primary_key=["category"])
    stats.top_n(2, order_by=["qty desc", "category asc"], rank_column="rnk", name="top2") \
        .to_table("top_categories", primary_key=["rnk"])
    stats.select({"cat": "upper(category)", "n": "n"}, name="upper").to_table("category_upper", primary_key=["cat"])
    units = orders.group_by("product_id").agg(units="sum(qty)", name="units")
    products.join(units, on={"id": "product_id"}, how="left", name="with_units") \
        .to_table("product_units", primary_key=["id"])
    return p


PLAN = shop_pipeline().plan()


# --- histories ------------------------------------------------------------------------------------
product_op = st.tuples(st.integers(1, 4), st.sampled_from(["a", "b", "c"]), st.integers(1, 9), st.booleans())
order_op = st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 5), st.booleans())


def to_batches(delivered: list[list], rnd: random.Random) -> list[dict[str, pa.Table]]:
    batches, i = [], 0
    while i < len(delivered):
        n = rnd.randint(1, 8)
        rows = [r for msg in delivered[i:i + n] for r in msg]
        batches.append({t: _changelog(t, [(k, r) for tt, k, r in rows if tt == t]) for t in KEYS})
        i += n
    return batches


def _changelog(table: str, rows: list) -> pa.Table:
    node = PLAN[table]
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in node.schema]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, node.schema)]
    return pa.Table.from_arrays(arrays + [pa.array([k for k, _ in rows], pa.int8())],
                                names=node.schema.names + [KIND])


# --- running ------------------------------------------------------------------------------------------
def open_sinks(root: Path) -> dict:
    return {n.table: open_sink(TableSpec(name=n.table, path=str(root / n.table), primary_key=n.primary_key),
                               pipeline_id="prop", engine="delta-rs") for n in PLAN.sinks}


def run(batches: list[dict], root: Path, crash: tuple[int, int] | None) -> None:
    """Micro-batches through the plan into Delta; ``crash=(batch, sinks applied)`` kills the run
    after that many of the batch's table commits, before its state checkpoint, then restarts from
    the last checkpoint and replays the batch (sinks skip what they already committed)."""
    runner, sinks = LocalRunner(PLAN), open_sinks(root)
    checkpoint = runner.snapshot()
    b = 0
    while b < len(batches):
        outs = runner.step(batches[b])
        crashed = False
        for i, (table, changes) in enumerate(sorted(outs.items())):
            if crash == (b, i):
                crashed = True
                break
            sink = sinks[table]
            sink.apply(sink_changes(changes, primary_key=sink.spec.primary_key, batch_id=b), batch_id=b)
        if crashed:
            crash = None
            runner, sinks = LocalRunner(PLAN), open_sinks(root)   # a new process
            runner.restore(checkpoint)
            continue
        checkpoint = runner.snapshot()
        b += 1


def table_rows(root: Path, table: str) -> set[tuple]:
    path = root / table
    names = PLAN[f"sink_{table}"].schema.names
    if not (path / "_delta_log").exists():
        return set()
    return {tuple(r.values()) for r in read_delta(str(path), columns=names).to_pylist()}


def oracle_rows(final: dict[str, dict]) -> dict[str, set[tuple]]:
    con = duckdb.connect()
    for table, rows in final.items():
        schema = PLAN[table].schema
        cols = list(zip(*rows.values())) if rows else [[] for _ in schema]
        con.register(table, pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)],
                                                 names=schema.names))
    out = {t: {tuple(int(v) if isinstance(v, int) else v for v in r.values()) for r in
               con.sql(q).to_arrow_table().to_pylist()} for t, (_, q) in ORACLE.items()}
    con.close()
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(products=st.lists(product_op, max_size=14), orders=st.lists(order_op, max_size=18),
       rnd=st.randoms(use_true_random=False), data=st.data())
def test_pipeline_tables_equal_the_batch_query_over_the_final_state(tmp_path_factory, products, orders, rnd, data):
    per_p, final_p = key_histories(products, "products")
    per_o, final_o = key_histories(orders, "orders")
    delivered = deliver({**{("p", k): v for k, v in per_p.items()}, **{("o", k): v for k, v in per_o.items()}}, rnd)
    batches = to_batches(delivered, rnd)
    crash = None
    if batches and data.draw(st.booleans(), label="crash"):
        crash = (data.draw(st.integers(0, len(batches) - 1), label="crash batch"),
                 data.draw(st.integers(0, len(PLAN.sinks) - 1), label="sinks committed before the crash"))
    root = tmp_path_factory.mktemp("lake")
    run(batches, root, crash)
    expected = oracle_rows({"products": final_p, "orders": final_o})
    for table in ORACLE:
        assert table_rows(root, table) == expected[table], table


def test_the_property_pipeline_exercises_every_operator_and_a_materializer():
    ops = {n.op for n in PLAN}
    assert {"normalize", "join", "aggregate", "rank", "project", "materialize", "sink"} <= ops
    assert PLAN["with_units"].config.join_type == "LEFT"
