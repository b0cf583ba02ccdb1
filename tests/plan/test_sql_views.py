"""Views written in SQL plan into the graph the step form builds: equal ``explain``, equal tables.

Each case writes a view both ways; the plans must print the same tree, and the in-process runner
must emit the same changes for both, on a random at-least-once history of the sources.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from changelake.changelog import KIND
from changelake.errors import ConfigError
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner

from .histories import D, I, UA, UB, deliver

pytestmark = pytest.mark.unit

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int", "status": "string"}
PRODUCTS = {"id": "bigint", "category": "string", "price": "bigint"}


def shop() -> Pipeline:
    p = Pipeline()
    p.source("orders", columns=ORDERS, primary_key=["order_id"])
    p.source("products", columns=PRODUCTS, primary_key=["id"])
    return p


def _value(t: pa.DataType, rnd: random.Random):
    if pa.types.is_string(t):
        return rnd.choice(["a", "b", "c", None])
    if pa.types.is_floating(t):
        return rnd.choice([0.5, 1.5, 2.0, None])
    return rnd.randint(1, 5)


def history(plan, rnd: random.Random, changes: int = 40) -> list[dict[str, pa.Table]]:
    """Random keyed changes of every source of ``plan`` (key in 1..6), delivered at least once, in micro-batches."""
    per_key: dict = {}
    for src in plan.sources:
        schema, key = src.schema, src.upsert_key
        ops = []
        for _ in range(changes):
            k = rnd.randint(1, 6)
            row = [k if f.name in key else _value(f.type, rnd) for f in schema]
            ops.append((k, tuple(row), rnd.random() < 0.2))
        state: dict = {}
        for k, row, delete in ops:
            pre = state.get(k)
            msg = [(I, row)] if pre is None else ([(D, pre)] if delete else [(UB, pre), (UA, row)])
            if pre is not None and delete:
                del state[k]
            else:
                state[k] = row
            per_key.setdefault((src.source, k), []).append([(src.source, kind, r) for kind, r in msg])
    delivered = deliver(per_key, rnd)
    batches, i = [], 0
    while i < len(delivered):
        n = rnd.randint(1, 6)
        rows = [r for msg in delivered[i:i + n] for r in msg]
        batches.append({s.source: _changelog(s.schema, [(k, r) for t, k, r in rows if t == s.source])
                        for s in plan.sources})
        i += n
    return batches


def _changelog(schema: pa.Schema, rows: list) -> pa.Table:
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in schema]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, schema)]
    return pa.Table.from_arrays(arrays + [pa.array([k for k, _ in rows], pa.int8())], names=schema.names + [KIND])


def outputs(p: Pipeline, batches) -> list[dict]:
    plan = p.plan()
    runner = LocalRunner(plan)
    read = {s.source for s in plan.sources}
    return [{t: c.to_pylist() for t, c in runner.step({s: t for s, t in b.items() if s in read}).items()}
            for b in batches]


def same(sql: Pipeline, step: Pipeline, seed: int = 1) -> None:
    """Equal explain, and equal changes from the in-process runner on a random history."""
    assert sql.explain() == step.explain()
    batches = history(step.plan(), random.Random(seed))
    got = outputs(sql, batches)
    assert got == outputs(step, batches)
    assert any(rows for out in got for rows in out.values()), "the history reaches the tables"


# --- SELECT, WHERE, CASE, CAST ------------------------------------------------------------------
def test_select_where_case_cast():
    a = shop()
    a.sql("big", """
        SELECT order_id, CAST(qty AS BIGINT) * 2 AS double_qty,
               CASE WHEN status = 'a' THEN 'new' WHEN status IS NULL THEN 'none' ELSE 'old' END AS phase
        FROM orders WHERE qty >= 2 AND status <> 'c'""").to_table("big", primary_key=["order_id"])
    b = shop()
    b.stream("orders").filter("(qty >= 2) AND (status <> 'c')", name="big_where") \
        .select({"order_id": "order_id", "double_qty": "CAST(qty AS BIGINT) * 2",
                 "phase": "CASE WHEN status = 'a' THEN 'new' WHEN status IS NULL THEN 'none' ELSE 'old' END"},
                name="big").to_table("big", primary_key=["order_id"])
    same(a, b)


def test_select_star_and_where_only_is_one_filter_named_for_the_view():
    a = shop()
    a.sql("paid", "SELECT * FROM orders WHERE status = 'a'").to_table("paid", primary_key=["order_id"])
    b = shop()
    b.stream("orders").filter("status = 'a'", name="paid").to_table("paid", primary_key=["order_id"])
    same(a, b)


# --- joins ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_join_kinds(how):
    written = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT OUTER JOIN", "full": "FULL OUTER JOIN"}[how]
    a = shop()
    a.sql("enriched", f"""SELECT o.order_id, o.qty, p.id, p.category FROM orders AS o {written} products p
                         ON o.product_id = p.id""").to_table("enriched", primary_key=["order_id", "id"])
    b = shop()
    b.stream("orders").join(b.stream("products"), on={"product_id": "id"}, how=how, name="enriched_join") \
        .select(["order_id", "qty", "id", "category"], name="enriched") \
        .to_table("enriched", primary_key=["order_id", "id"])
    same(a, b)


def test_comma_join_with_where_and_a_residual_condition():
    a = shop()
    a.sql("cheap", """SELECT o.order_id, p.price FROM orders o, products p
                      WHERE o.product_id = p.id AND p.price < o.qty AND o.status = 'a'""") \
        .to_table("cheap", primary_key=["order_id"])
    b = shop()
    b.stream("orders").join(b.stream("products"), on={"product_id": "id"}, name="cheap_join") \
        .filter("price < qty", name="cheap_on").filter("status = 'a'", name="cheap_where") \
        .select(["order_id", "price"], name="cheap").to_table("cheap", primary_key=["order_id"])
    same(a, b)


def test_left_join_condition_on_the_padded_side_filters_it_first():
    a = shop()
    a.sql("v", """SELECT o.order_id, p.category FROM orders o LEFT JOIN products p
                  ON o.product_id = p.id AND p.price > 2""").to_table("v", primary_key=["order_id"])
    b = shop()
    right = b.stream("products").filter("price > 2", name="v_on")
    b.stream("orders").join(right, on={"product_id": "id"}, how="left", name="v_join") \
        .select(["order_id", "category"], name="v").to_table("v", primary_key=["order_id"])
    same(a, b)


def test_a_clashing_right_column_is_read_under_its_query_name():
    a = Pipeline()
    a.source("l", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    a.source("r", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    a.sql("j", "SELECT l.id, r.v AS rv, l.v FROM l JOIN r ON l.id = r.id").to_table("j", primary_key=["id"])
    b = Pipeline()
    b.source("l", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    b.source("r", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    b.stream("l").join(b.stream("r"), on=["id"], name="j_join") \
        .select({"id": "id", "rv": "r_v", "v": "v"}, name="j").to_table("j", primary_key=["id"])
    same(a, b)


# --- GROUP BY -------------------------------------------------------------------------------------
def test_group_by_every_aggregate_and_having():
    a = shop()
    a.sql("stats", """
        SELECT product_id, COUNT(*) AS n, COUNT(status) AS with_status, COUNT(DISTINCT status) AS statuses,
               SUM(qty) AS total, AVG(qty) AS mean, MIN(qty) AS lo, MAX(qty) AS hi
        FROM orders GROUP BY product_id HAVING COUNT(*) > 1""").to_table("stats", primary_key=["product_id"])
    b = shop()
    b.stream("orders").group_by("product_id").agg(
        n="count(*)", with_status="count(status)", statuses="count(distinct status)", total="sum(qty)",
        mean="avg(qty)", lo="min(qty)", hi="max(qty)", name="stats_group_by") \
        .filter("n > 1", name="stats").to_table("stats", primary_key=["product_id"])
    same(a, b)


def test_group_by_an_expression_with_an_aggregate_of_an_expression_and_a_computed_output():
    a = shop()
    a.sql("s", """SELECT UPPER(status) AS st, SUM(qty * 2) AS dbl, MAX(qty) - MIN(qty) AS spread
                  FROM orders GROUP BY UPPER(status)""").to_table("s", primary_key=["st"])
    b = shop()
    b.stream("orders").select({"st": "UPPER(status)", "dbl_arg": "qty * 2", "qty": "qty"}, name="s_pre") \
        .group_by("st").agg({"dbl": "sum(dbl_arg)", "agg_2": "max(qty)", "agg_3": "min(qty)"}, name="s_group_by") \
        .select({"st": "st", "dbl": "dbl", "spread": "agg_2 - agg_3"}, name="s").to_table("s", primary_key=["st"])
    same(a, b)


def test_join_then_group_by_a_right_column():
    a = shop()
    a.sql("by_category", """SELECT p.category, COUNT(*) AS orders, SUM(p.price) AS revenue
                            FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category""") \
        .to_table("by_category", primary_key=["category"])
    b = shop()
    b.stream("orders").join(b.stream("products"), on={"product_id": "id"}, name="by_category_join") \
        .group_by("category").agg(orders="count(*)", revenue="sum(price)", name="by_category") \
        .to_table("by_category", primary_key=["category"])
    same(a, b)


# --- Top-N and deduplication ---------------------------------------------------------------------
def test_top_n_with_the_rank_column():
    a = shop()
    a.sql("top2", """SELECT * FROM (
                       SELECT *, ROW_NUMBER() OVER (PARTITION BY category ORDER BY price DESC, id) AS rn
                       FROM products)
                     WHERE rn <= 2""").to_table("top2", primary_key=["category", "rn"])
    b = shop()
    b.stream("products").top_n(2, order_by=["price desc", "id"], partition_by=["category"], rank_column="rn",
                               name="top2").to_table("top2", primary_key=["category", "rn"])
    same(a, b)


def test_top_n_without_the_rank_column_and_rn_lt():
    a = shop()
    a.sql("top", """SELECT id, price FROM (
                      SELECT id, price, ROW_NUMBER() OVER (ORDER BY price ASC NULLS FIRST) AS rn FROM products) t
                    WHERE rn < 4""").to_table("top", primary_key=["id"])
    b = shop()
    b.stream("products").select(["id", "price"], name="top_select") \
        .top_n(3, order_by=["price asc nulls first"], name="top").to_table("top", primary_key=["id"])
    same(a, b)


def test_top_n_of_an_aggregate_in_a_with_query():
    a = shop()
    a.sql("best", """WITH sales AS (SELECT product_id, SUM(qty) AS units FROM orders GROUP BY product_id)
                     SELECT product_id, units, r FROM (
                       SELECT *, ROW_NUMBER() OVER (ORDER BY units DESC, product_id) AS r FROM sales)
                     WHERE r <= 3""").to_table("best", primary_key=["r"])
    b = shop()
    b.stream("orders").group_by("product_id").agg(units="sum(qty)", name="best_group_by") \
        .top_n(3, order_by=["units desc", "product_id"], rank_column="r", name="best") \
        .to_table("best", primary_key=["r"])
    same(a, b)


def test_dedup_by_processing_time_keeps_the_last_row():
    a = shop()
    a.sql("latest", """SELECT order_id, product_id, qty, status FROM (
                         SELECT *, ROW_NUMBER() OVER (PARTITION BY product_id ORDER BY PROCTIME() DESC) AS rn
                         FROM orders) WHERE rn = 1""").to_table("latest", primary_key=["product_id"])
    b = shop()
    b.stream("orders").deduplicate(["product_id"], keep="last", name="latest") \
        .to_table("latest", primary_key=["product_id"])
    same(a, b)


def test_dedup_by_event_time_on_an_append_only_source():
    def base():
        p = Pipeline()
        p.source("clicks", columns={"user_id": "bigint", "url": "string", "ts": "bigint"}, append_only=True,
                 event_time="ts")
        return p

    a = base()
    a.sql("first_click", """SELECT user_id, url, ts FROM (
                              SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY ts) AS rn FROM clicks)
                            WHERE rn <= 1""").to_table("first_click", primary_key=["user_id"])
    b = base()
    b.stream("clicks").deduplicate(["user_id"], keep="first", order_by="ts", name="first_click") \
        .to_table("first_click", primary_key=["user_id"])
    assert a.explain() == b.explain()


# --- semi and anti joins --------------------------------------------------------------------------
def test_in_subquery_is_a_semi_join_and_not_exists_an_anti_join():
    a = shop()
    a.sql("sold", "SELECT * FROM products WHERE id IN (SELECT product_id FROM orders WHERE qty > 1)") \
        .to_table("sold", primary_key=["id"])
    a.sql("unsold", """SELECT id, category FROM products p
                       WHERE NOT EXISTS (SELECT * FROM orders o WHERE o.product_id = p.id) AND p.price > 1""") \
        .to_table("unsold", primary_key=["id"])
    b = shop()
    sold_orders = b.stream("orders").filter("qty > 1", name="sold_where").select(["product_id"], name="sold_select")
    b.stream("products").join(sold_orders, on={"id": "product_id"}, how="semi", name="sold") \
        .to_table("sold", primary_key=["id"])
    b.stream("products").filter("price > 1", name="unsold_where") \
        .join(b.stream("orders"), on={"id": "product_id"}, how="anti", name="unsold_anti") \
        .select(["id", "category"], name="unsold").to_table("unsold", primary_key=["id"])
    same(a, b)


# --- time-bounded joins ---------------------------------------------------------------------------
def timed() -> Pipeline:
    p = Pipeline()
    p.source("orders", columns={"order_id": "bigint", "currency": "string", "amount": "bigint",
                                "order_time": "timestamp"}, append_only=True, event_time="order_time",
             watermark_delay="5 seconds")
    p.source("shipments", columns={"ship_id": "bigint", "order_id": "bigint", "ship_time": "timestamp"},
             append_only=True, event_time="ship_time")
    p.source("rates", columns={"currency": "string", "rate": "double", "rate_time": "timestamp"},
             primary_key=["currency"], event_time="rate_time")
    return p


def test_interval_join_between():
    a = timed()
    a.sql("shipped", """SELECT o.order_id, s.ship_id, o.order_time FROM orders o, shipments s
                        WHERE o.order_id = s.order_id
                          AND o.order_time BETWEEN s.ship_time - INTERVAL '4' HOUR AND s.ship_time""") \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    b = timed()
    b.stream("orders").interval_join(b.stream("shipments"), on=["order_id"], before="4 hours", after="0 s",
                                     name="shipped_join") \
        .select(["order_id", "ship_id", "order_time"], name="shipped") \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    assert a.explain() == b.explain()
    a2 = timed()
    a2.sql("shipped", """SELECT o.order_id, s.ship_id, o.order_time FROM orders o LEFT JOIN shipments s
                         ON o.order_id = s.order_id
                         AND s.ship_time BETWEEN o.order_time AND o.order_time + INTERVAL '4' HOUR""") \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    b2 = timed()
    b2.stream("orders").interval_join(b2.stream("shipments"), on=["order_id"], before="4 hours", after="0 s",
                                      how="left", name="shipped_join") \
        .select(["order_id", "ship_id", "order_time"], name="shipped") \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    assert a2.explain() == b2.explain()
    batches = timed_batches(random.Random(3))
    got = outputs(a2, batches)
    assert got == outputs(b2, batches) and any(out["shipped"] for out in got)


@pytest.mark.parametrize("bounds, before, after", [
    ("o.order_time >= s.ship_time - INTERVAL '4' HOUR AND o.order_time <= s.ship_time", "4 hours", "0 ms"),
    # the right input's column on the left of the comparison, and strict bounds: one millisecond in
    ("s.ship_time + INTERVAL '1' MINUTE > o.order_time AND s.ship_time - INTERVAL '2' HOUR < o.order_time",
     "7199999 ms", "59999 ms"),
    ("o.order_time BETWEEN s.ship_time - INTERVAL '4' HOUR AND s.ship_time", "4 hours", "0 ms"),
])
def test_interval_join_of_two_comparisons_is_the_between(bounds, before, after):
    a = timed()
    a.sql("shipped", f"""SELECT o.order_id, s.ship_id, o.order_time FROM orders o LEFT JOIN shipments s
                         ON o.order_id = s.order_id AND {bounds}""").to_table("shipped", primary_key=["order_id"])
    b = timed()
    b.stream("orders").interval_join(b.stream("shipments"), on=["order_id"], before=before, after=after,
                                     how="left", name="shipped_join") \
        .select(["order_id", "ship_id", "order_time"], name="shipped").to_table("shipped", primary_key=["order_id"])
    assert a.explain() == b.explain()
    batches = timed_batches(random.Random(5))
    assert outputs(a, batches) == outputs(b, batches)


def test_comparisons_of_columns_that_are_not_event_times_stay_a_join_condition():
    p = timed()
    p.sql("v", """SELECT o.order_id, s.ship_id FROM orders o, shipments s
                  WHERE o.order_id = s.order_id AND o.amount >= s.ship_id AND o.amount <= s.ship_id + 10""") \
        .to_table("v", primary_key=["order_id", "ship_id"])
    ops = [n.op for n in p.plan()]
    assert "join" in ops and "filter" in ops and "interval_join" not in ops


def timed_batches(rnd: random.Random) -> list[dict[str, pa.Table]]:
    """Orders, shipments and rate changes with event times moving forward (some out of order), in batches."""
    from datetime import datetime, timedelta, timezone

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    schemas = {n.name: n.params["schema"] for n in timed().nodes.values()}
    batches = []
    for b in range(8):
        minute = lambda: t0 + timedelta(minutes=30 * b + rnd.randint(-20, 20))    # noqa: E731
        rows = {
            "orders": [(I, (10 * b + i, rnd.choice(["EUR", "USD"]), rnd.randint(1, 9), minute())) for i in range(3)],
            "shipments": [(I, (100 * b + i, 10 * (b - rnd.randint(0, 2)) + rnd.randint(0, 2), minute()))
                          for i in range(3)],
            "rates": [(I if b == 0 else UA, (c, rnd.randint(1, 5) / 2, minute())) for c in ("EUR", "USD")],
        }
        batches.append({s: _changelog(schemas[s], r) for s, r in rows.items()})
    return batches


def test_temporal_join_for_system_time_as_of():
    a = timed()
    a.sql("priced", """SELECT o.order_id, o.amount * r.rate AS value FROM orders AS o
                       LEFT JOIN rates FOR SYSTEM_TIME AS OF o.order_time AS r ON o.currency = r.currency""") \
        .to_table("priced", primary_key=["order_id"])
    b = timed()
    b.stream("orders").temporal_join(b.stream("rates"), on=["currency"], time="order_time", how="left",
                                     name="priced_join") \
        .select({"order_id": "order_id", "value": "amount * rate"}, name="priced") \
        .to_table("priced", primary_key=["order_id"])
    assert a.explain() == b.explain()
    batches = timed_batches(random.Random(5))
    got = outputs(a, batches)
    assert got == outputs(b, batches) and any(out["priced"] for out in got)


def test_lookup_join_for_system_time_as_of_proc_time(tmp_path):
    from changelake.plan import Lookup

    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "dim"), pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                                                      "category": ["x", "y", None]}))
    dim = Lookup.delta("dim", str(tmp_path / "dim"), columns={"id": "bigint", "category": "string"}, key=["id"])
    a = shop()
    a.sql("enriched", """SELECT o.order_id, d.category FROM orders o
                         JOIN dim FOR SYSTEM_TIME AS OF o.proc_time AS d ON o.product_id = d.id""",
          lookups={"dim": dim}).to_table("enriched", primary_key=["order_id"])
    b = shop()
    b.stream("orders").lookup_join(dim, on={"product_id": "id"}, name="enriched_join") \
        .select(["order_id", "category"], name="enriched").to_table("enriched", primary_key=["order_id"])
    same(a, b)


# --- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("query, says", [
    ("SELECT order_id, md5(status) AS h FROM orders", "the function MD5() is not supported in a view"),
    ("SELECT order_id,\n  NOW() AS t FROM orders", "non-deterministic function NOW() over the updating input"),
    ("SELECT id FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY price) AS rn FROM products)",
     "needs WHERE rn <= N"),
    ("SELECT * FROM products WHERE id NOT IN (SELECT product_id FROM orders)",
     "may be NULL (the subquery's product_id)"),
    ("SELECT nope FROM orders", "unknown column nope"),
    ("SELECT * FROM nowhere", "no source or view named 'nowhere'"),
    ("SELECT DISTINCT status FROM orders", "SELECT DISTINCT is not supported"),
    ("SELECT status, qty, COUNT(*) AS n FROM orders GROUP BY status",
     "qty is neither in GROUP BY nor inside an aggregate"),
    ("SELECT * FROM orders o JOIN products p ON o.qty > p.price", "a join needs an equality"),
    ("SELECT * FROM orders WHERE", "cannot parse the query at line 1"),
])
def test_errors_name_the_construct_and_the_fix(query, says):
    p = shop()
    with pytest.raises(ConfigError, match=None) as err:
        p.sql("v", query)
    assert says in str(err.value)
    assert list(p.nodes) == ["orders", "products"], "a failed view leaves no nodes behind"


def test_non_deterministic_error_names_its_line():
    with pytest.raises(ConfigError) as err:
        shop().sql("v", "SELECT order_id,\n  NOW() AS t FROM orders")
    assert "(line 2, column 3)" in str(err.value)


def test_top_n_without_rank_column_over_an_input_without_key_is_an_error():
    p = Pipeline()
    p.source("events", columns={"user_id": "bigint", "score": "int"}, append_only=True)
    with pytest.raises(ConfigError) as err:
        p.sql("top", "SELECT user_id, score FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY score DESC) AS rn "
                     "FROM events) WHERE rn <= 3")
    assert "select rn" in str(err.value) and "input key: none" in str(err.value)


def test_every_unsupported_construct_is_listed():
    with pytest.raises(ConfigError) as err:
        shop().sql("v", "SELECT md5(status) AS a, sha1(status) AS b FROM orders UNION SELECT 1, 2 FROM orders")
    text = str(err.value)
    assert "3 errors" in text and "MD5" in text and "SHA" in text and "UNION" in text


# --- YAML and validate ----------------------------------------------------------------------------
HEADER = """
pipeline: {id: sqlviews, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [o], columns: {order_id: bigint, product_id: bigint, qty: int}, primary_key: [order_id]}
  - {name: products, topics: [p], columns: {id: bigint, category: string, price: bigint}, primary_key: [id]}
"""


def test_a_yaml_sql_view_explains_as_its_step_form():
    from changelake.service.config import parse_config
    from changelake.service.explain import explain

    sql = parse_config(HEADER + """
views:
  - name: by_category
    state_ttl: 1 day
    sql: |
      SELECT p.category, COUNT(*) AS orders, SUM(o.qty) AS units
      FROM orders o JOIN products p ON o.product_id = p.id
      GROUP BY p.category
tables:
  - {name: category_sales, from: by_category, primary_key: [category]}
""", environ={})
    steps = parse_config(HEADER + """
views:
  - name: by_category_join
    state_ttl: 1 day
    join: {left: orders, right: products, on: {product_id: id}}
  - name: by_category
    state_ttl: 1 day
    from: by_category_join
    group_by: [category]
    aggregates: {orders: "count(*)", units: "sum(qty)"}
tables:
  - {name: category_sales, from: by_category, primary_key: [category]}
""", environ={})
    assert explain(sql) == explain(steps)
    assert "stateTtl=[86400000 ms]" in explain(sql).split("Join(")[1]     # the view's TTL on each of its nodes


def test_a_sql_view_reads_a_lookup_and_a_view_defined_above_it():
    from changelake.service.config import parse_config
    from changelake.service.views import pipeline_from_config

    config = parse_config(HEADER + """
lookups:
  - {name: dim, delta: {path: dim}, columns: {id: bigint, label: string}, key: [id]}
views:
  - name: cheap
    filter: "price < 3"
    from: products
  - name: labelled
    sql: |
      SELECT o.order_id, d.label FROM orders o JOIN cheap c ON o.product_id = c.id
      LEFT JOIN dim FOR SYSTEM_TIME AS OF o.proc_time AS d ON o.product_id = d.id
tables:
  - {name: labelled, from: labelled, primary_key: [order_id]}
""", environ={})
    plan = pipeline_from_config(config).plan()
    assert [n.op for n in plan if n.id.startswith("labelled")] == ["join", "lookup_join", "project"]


def test_validate_lists_every_error_of_every_sql_view(tmp_path, capsys):
    from changelake.service.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(HEADER + """
views:
  - name: a
    sql: "SELECT order_id, md5(qty) AS h, NOW() AS t FROM orders"
  - name: b
    sql: "SELECT id, nope FROM products"
  - name: c
    sql: "SELECT * FROM b"
tables:
  - {name: a, from: a, primary_key: [order_id]}
  - {name: c, from: c, primary_key: [id]}
""")
    assert main(["validate", "-c", str(path)]) != 0
    err = capsys.readouterr().err
    assert "views.0.sql: view 'a': the function MD5() is not supported in a view" in err
    assert "(line 1, column 18)" in err
    assert "views.1.sql: view 'b': unknown column nope" in err and "(line 1, column 12)" in err
    assert "2 error(s)" in err


def test_top_n_partitioned_and_ordered_by_from_columns_the_select_list_renames_or_drops():
    a = shop()
    a.sql("v", """SELECT * FROM (
                    SELECT o.order_id, o.product_id AS part,
                           ROW_NUMBER() OVER (PARTITION BY o.product_id ORDER BY o.qty DESC, o.order_id) AS rn
                    FROM orders o) t
                  WHERE rn <= 2""").to_table("v", primary_key=["part", "rn"])
    b = shop()
    b.stream("orders").select({"order_id": "order_id", "part": "product_id", "qty": "qty"}, name="v_select") \
        .top_n(2, order_by=["qty desc", "order_id"], partition_by=["part"], rank_column="rn", name="v_top_n") \
        .select(["order_id", "part", "rn"], name="v").to_table("v", primary_key=["part", "rn"])
    same(a, b)


def test_an_in_subquery_stays_a_semi_join_after_an_inner_join():
    a = shop()
    a.sql("v", """SELECT o.order_id, p.category FROM orders o JOIN products p ON o.product_id = p.id
                  WHERE o.product_id IN (SELECT id FROM products WHERE price > 2)""") \
        .to_table("v", primary_key=["order_id"])
    b = shop()
    cheap = b.stream("products").filter("price > 2", name="v_where").select(["id"], name="v_select")
    b.stream("orders").join(b.stream("products"), on={"product_id": "id"}, name="v_join") \
        .join(cheap, on={"product_id": "id"}, how="semi", name="v_semi") \
        .select(["order_id", "category"], name="v").to_table("v", primary_key=["order_id"])
    same(a, b)


def test_not_in_over_never_null_columns_is_an_anti_join():
    a = shop()
    a.sql("v", """SELECT * FROM products
                  WHERE id NOT IN (SELECT product_id FROM orders WHERE product_id IS NOT NULL)""") \
        .to_table("v", primary_key=["id"])
    b = shop()
    sub = b.stream("orders").filter("NOT product_id IS NULL", name="v_where").select(["product_id"], name="v_select")
    b.stream("products").join(sub, on={"id": "product_id"}, how="anti", name="v").to_table("v", primary_key=["id"])
    same(a, b)


def test_a_repeated_output_name_gets_flinks_suffix():
    a = shop()
    a.sql("v", "SELECT * FROM orders o JOIN products p ON o.product_id = p.id AND o.order_id = p.id") \
        .to_table("v", primary_key=["order_id"])
    b = shop()
    b.stream("orders").join(b.stream("products"), on={"product_id": "id", "order_id": "id"}, name="v") \
        .to_table("v", primary_key=["order_id"])
    assert a.explain() == b.explain()
    c = Pipeline()
    c.source("l", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    c.source("r", columns={"id": "bigint", "v": "int"}, primary_key=["id"])
    c.sql("j", "SELECT l.id, r.id, l.v, r.v FROM l JOIN r ON l.id = r.id").to_table("j", primary_key=["id"])
    assert c.plan()["j"].schema.names == ["id", "id0", "v", "v0"]
