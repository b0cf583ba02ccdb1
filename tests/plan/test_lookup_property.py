"""Property: random CDC histories of orders, delivered in random micro-batches (per-key order kept,
keys interleaved, at-least-once re-deliveries), looked up in a random dimension table (a Delta
table, or a PostgreSQL table of the ``postgres`` fixture) through inner and left lookup joins and
an aggregate over the inner join, into Delta tables, end equal to the same queries run by DuckDB
over the orders' final state and the dimension.

The dimension does not change during a run: a lookup join joins each change with the dimension's
row at the time it is processed, so only a fixed dimension has a batch equivalent (see
docs/pipelines.md, "Lookup join"). Caches are small and short-lived, so hits, misses, evictions
and expiries all happen.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.plan import CacheOptions, Lookup, Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes

from .histories import deliver, key_histories

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int"}
PRODUCTS = {"id": "bigint", "category": "string", "qty": "int"}         # qty clashes: products_qty

ORACLE = {
    "inner_lines": """SELECT o.order_id, o.product_id, o.qty, p.id, p.category, p.qty AS products_qty
                      FROM orders o JOIN products p ON o.product_id = p.id""",
    "left_lines": """SELECT o.order_id, o.product_id, o.qty, p.id, p.category, p.qty AS products_qty
                     FROM orders o LEFT JOIN products p ON o.product_id = p.id""",
    "by_category": """SELECT p.category, count(*) AS n, sum(o.qty) AS qty
                      FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category""",
}
PK = {"inner_lines": ["order_id"], "left_lines": ["order_id"], "by_category": ["category"]}


def pipeline(lookup: Lookup) -> Pipeline:
    """The same orders twice: once into the joins' tables (the inner join feeding only a table must
    still get -U to retract a row whose update it drops), once into an aggregate over an inner join."""
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    orders.lookup_join(lookup, on={"product_id": "id"}, name="inner_join") \
        .to_table("inner_lines", primary_key=["order_id"])
    orders.lookup_join(lookup, on={"product_id": "id"}, how="left", name="left_join") \
        .to_table("left_lines", primary_key=["order_id"])
    p.source("orders_again", columns=ORDERS, primary_key=["order_id"]) \
        .lookup_join(lookup, on={"product_id": "id"}, name="inner_join_again") \
        .group_by("category").agg(n="count(*)", qty="sum(qty)", name="stats") \
        .to_table("by_category", primary_key=["category"])
    return p


# --- histories ------------------------------------------------------------------------------------
order_op = st.tuples(st.integers(1, 8), st.one_of(st.none(), st.integers(1, 7)), st.integers(1, 5), st.booleans())
dimension = st.dictionaries(st.integers(1, 6), st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9)),
                            max_size=6)
cache = st.sampled_from([CacheOptions(max_rows=2, ttl=None), CacheOptions(max_rows=100, ttl="10 minutes"),
                         CacheOptions(max_rows=0), CacheOptions(max_rows=3, ttl="1 ms")])


def batches(delivered: list[list], rnd: random.Random) -> list[pa.Table]:
    out, i = [], 0
    schema = pa.schema([("order_id", pa.int64()), ("product_id", pa.int64()), ("qty", pa.int32())])
    while i < len(delivered):
        n = rnd.randint(1, 10)
        rows = [r for msg in delivered[i:i + n] for r in msg]
        cols = list(zip(*[r for _, r in rows]))
        out.append(pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema)]
                                        + [pa.array([k for k, _ in rows], pa.int8())], names=schema.names + [KIND]))
        i += n
    return out


# --- running ----------------------------------------------------------------------------------------
def run(lookup: Lookup, changes: list[pa.Table], root: Path) -> dict[str, set[tuple]]:
    plan = pipeline(lookup).plan()
    sinks = {n.table: open_sink(TableSpec(name=n.table, path=str(root / n.table), primary_key=n.primary_key),
                                pipeline_id="lookup-prop", engine="delta-rs") for n in plan.sinks}
    runner = LocalRunner(plan)
    try:
        for b, batch in enumerate(changes):
            for table, out in runner.step({"orders": batch, "orders_again": batch}).items():
                sink = sinks[table]
                sink.apply(sink_changes(out, primary_key=sink.spec.primary_key, batch_id=b), batch_id=b)
    finally:
        runner.close()
    got = {}
    for n in plan.sinks:
        path = root / n.table
        got[n.table] = set() if not (path / "_delta_log").exists() else \
            {tuple(r.values()) for r in read_delta(str(path), columns=n.schema.names).to_pylist()}
    return got


def oracle(final: dict[int, tuple], dim: dict[int, tuple]) -> dict[str, set[tuple]]:
    con = duckdb.connect()
    o = list(final.values())
    con.register("orders", pa.table({"order_id": pa.array([r[0] for r in o], pa.int64()),
                                     "product_id": pa.array([r[1] for r in o], pa.int64()),
                                     "qty": pa.array([r[2] for r in o], pa.int32())}))
    con.register("products", dimension_table(dim))
    out = {t: {tuple(r.values()) for r in con.sql(q).to_arrow_table().to_pylist()} for t, q in ORACLE.items()}
    con.close()
    return out


def dimension_table(dim: dict[int, tuple]) -> pa.Table:
    return pa.table({"id": pa.array(list(dim), pa.int64()), "category": pa.array([v[0] for v in dim.values()]),
                     "qty": pa.array([v[1] for v in dim.values()], pa.int32())})


def check(lookup: Lookup, ops, dim, rnd, root: Path) -> None:
    per_key, final = key_histories(ops)
    got = run(lookup, batches(deliver(per_key, rnd), rnd), root)
    want = oracle(final, dim)
    for table in ORACLE:
        assert got[table] == want[table], table


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.unit
@SETTINGS
@given(ops=st.lists(order_op, max_size=20), dim=dimension, cache_options=cache, rnd=st.randoms(use_true_random=False))
def test_lookup_join_to_a_delta_dimension_equals_the_batch_join(tmp_path_factory, ops, dim, cache_options, rnd):
    root = tmp_path_factory.mktemp("lake")
    write_deltalake(str(root / "products"), dimension_table(dim))
    lookup = Lookup.delta("products", str(root / "products"), columns=PRODUCTS, key=["id"], cache=cache_options,
                          batch_size=rnd.choice([1, 2, 100]))
    check(lookup, ops, dim, rnd, root)


@pytest.mark.postgres
@SETTINGS
@given(ops=st.lists(order_op, max_size=20), dim=dimension, cache_options=cache, rnd=st.randoms(use_true_random=False))
def test_lookup_join_to_a_postgres_dimension_equals_the_batch_join(postgres, tmp_path_factory, monkeypatch, ops, dim,
                                                                   cache_options, rnd):
    postgres.execute("DROP TABLE IF EXISTS prop_products",
                     "CREATE TABLE prop_products (id bigint PRIMARY KEY, category text, qty int, other text)")
    for k, (category, qty) in dim.items():
        postgres.execute("INSERT INTO prop_products VALUES (%s, %s, %s, 'x')", params=[k, category, qty])
    monkeypatch.setenv("PROP_PG_PASSWORD", postgres.password)
    lookup = Lookup.postgres("products", postgres.url, table="prop_products", columns=PRODUCTS, key=["id"],
                             user=postgres.user, password_env="PROP_PG_PASSWORD", cache=cache_options,
                             batch_size=rnd.choice([1, 2, 100]), max_concurrency=rnd.choice([1, 3]))
    check(lookup, ops, dim, rnd, tmp_path_factory.mktemp("lake"))
