"""Property: random SQL views, drawn from a grammar of the supported constructs over three related
tables, run on random at-least-once CDC histories (re-deliveries, keys interleaved, random micro-
batches) into Delta tables, and end equal to DuckDB running the same query text over the sources'
final state.

The grammar: FROM orders, optionally [LEFT] JOIN products and [LEFT] JOIN users; a WHERE of
comparisons, IS [NOT] NULL, BETWEEN, IN lists, and an IN / EXISTS / NOT EXISTS subquery; then one
shape: a SELECT list of columns, arithmetic, CASE, CAST and COALESCE; a GROUP BY with COUNT(*),
COUNT(DISTINCT), SUM, MIN, MAX, AVG and HAVING (AVG over a DOUBLE: over an integer column it is an
integer, as in Flink, where DuckDB's is a DOUBLE); a Top-N of that aggregate in a WITH query; or a
Top-N per partition of the joined rows in a FROM subquery. Sort keys end with a unique column and
say NULLS FIRST / LAST, so the result is a function of the final state (DuckDB's default NULL order
is not the step form's). The plan runs in-process (:class:`LocalRunner`).
"""

from __future__ import annotations

import math
import random

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
from changelake.types import arrow_schema

from .histories import deliver, key_histories

pytestmark = pytest.mark.unit

TABLES = {
    "orders": ({"order_id": "bigint", "product_id": "bigint", "user_id": "bigint", "qty": "int",
                "status": "string"}, "order_id"),
    "products": ({"id": "bigint", "category": "string", "price": "bigint"}, "id"),
    "users": ({"uid": "bigint", "region": "string"}, "uid"),
}
SCHEMAS = {t: arrow_schema(cols) for t, (cols, _) in TABLES.items()}


# --- the grammar ------------------------------------------------------------------------------------
@st.composite
def queries(draw) -> tuple[str, list[str]]:
    """(query, the table's primary key) of one random view."""
    joins, cols = [], {"o.order_id": "int", "o.product_id": "int", "o.user_id": "int", "o.qty": "int",
                       "o.status": "str"}
    if draw(st.booleans()):
        joins.append(f"{draw(st.sampled_from(['JOIN', 'LEFT JOIN']))} products p ON o.product_id = p.id")
        cols |= {"p.category": "str", "p.price": "int"}
    if draw(st.booleans()):
        joins.append(f"{draw(st.sampled_from(['JOIN', 'LEFT JOIN']))} users u ON u.uid = o.user_id")
        cols |= {"u.region": "str"}
    ints = [c for c, t in cols.items() if t == "int" and not c.endswith("_id")]
    strs = [c for c, t in cols.items() if t == "str"]
    terms = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["cmp", "null", "between", "in", "or"]))
        if kind == "cmp":
            terms.append(f"{draw(st.sampled_from(ints))} {draw(st.sampled_from(['>', '<=', '<>', '=']))} "
                         f"{draw(st.integers(1, 5))}")
        elif kind == "null":
            terms.append(f"{draw(st.sampled_from(strs))} IS {draw(st.sampled_from(['', 'NOT ']))}NULL")
        elif kind == "between":
            lo = draw(st.integers(1, 4))
            terms.append(f"{draw(st.sampled_from(ints))} BETWEEN {lo} AND {lo + draw(st.integers(0, 2))}")
        elif kind == "in":
            terms.append(f"{draw(st.sampled_from(strs))} IN ('a', '{draw(st.sampled_from('bc'))}')")
        else:
            terms.append(f"({draw(st.sampled_from(ints))} < 3 OR {draw(st.sampled_from(strs))} = 'b')")
    sub = draw(st.sampled_from([None, "in", "exists", "not_exists"]))
    if sub == "in":
        terms.append(f"o.product_id IN (SELECT id FROM products WHERE price > {draw(st.integers(1, 4))})")
    elif sub:
        terms.append(f"{'NOT ' if sub == 'not_exists' else ''}EXISTS (SELECT * FROM users x "
                     f"WHERE x.uid = o.user_id AND x.region = '{draw(st.sampled_from('abc'))}')")
    body = "FROM orders o " + " ".join(joins) + (" WHERE " + " AND ".join(terms) if terms else "")
    shape = draw(st.sampled_from(["select", "group", "top_group", "top_rows"]))
    if shape == "select":
        items = ["o.order_id"]
        for i in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["col", "arith", "case", "cast", "coalesce"]))
            if kind == "col":
                items.append(f"{draw(st.sampled_from(list(cols)))} AS c{i}")
            elif kind == "arith":
                items.append(f"{draw(st.sampled_from(ints))} * {draw(st.integers(1, 3))} + "
                             f"{draw(st.sampled_from(ints))} AS c{i}")
            elif kind == "case":
                items.append(f"CASE WHEN {draw(st.sampled_from(ints))} > 2 THEN 'hi' "
                             f"WHEN {draw(st.sampled_from(strs))} IS NULL THEN 'none' ELSE 'lo' END AS c{i}")
            elif kind == "cast":
                items.append(f"CAST({draw(st.sampled_from(ints))} AS BIGINT) AS c{i}")
            else:
                items.append(f"COALESCE({draw(st.sampled_from(strs))}, 'z') AS c{i}")
        return f"SELECT {', '.join(items)} {body}", ["order_id"]
    key = draw(st.sampled_from([c for c in cols if c in ("o.status", "o.product_id", "p.category", "u.region")]))
    k = key.split(".")[1]
    aggs = ["COUNT(*) AS n"]
    for i, fn in enumerate(draw(st.lists(st.sampled_from(["COUNT(DISTINCT {s})", "SUM({i})", "MIN({i})", "MAX({s})",
                                                          "AVG(CAST({i} AS DOUBLE))",
                                                          "COUNT({s})"]), max_size=3, unique=True))):
        aggs.append(fn.format(i=draw(st.sampled_from(ints)), s=draw(st.sampled_from(strs))) + f" AS a{i}")
    having = f" HAVING COUNT(*) > {draw(st.integers(0, 2))}" if draw(st.booleans()) else ""
    grouped = f"SELECT {key}, {', '.join(aggs)} {body} GROUP BY {key}{having}"
    if shape == "group":
        return grouped, [k]
    n = draw(st.integers(1, 3))
    if shape == "top_group":
        return (f"WITH g AS ({grouped}) SELECT * FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY n DESC NULLS LAST, "
                f"{k} ASC NULLS LAST) AS rn FROM g) t WHERE rn <= {n}"), ["rn"]
    order = draw(st.sampled_from(ints))
    return (f"SELECT * FROM (SELECT o.order_id, {key} AS part, {order} AS v, ROW_NUMBER() OVER (PARTITION BY {key} "
            f"ORDER BY {order} DESC NULLS FIRST, o.order_id) AS rn {body}) t WHERE rn <= {n}"), ["part", "rn"]


# --- histories ----------------------------------------------------------------------------------------
def ops(table: str, rnd: random.Random) -> list[tuple]:
    """Random changes of ``table``: (key, the other columns, delete), keys 1..5, about one in five a delete."""
    cols, key = TABLES[table]
    value = {"bigint": lambda: rnd.randint(1, 4), "int": lambda: rnd.randint(1, 5),
             "string": lambda: rnd.choice(["a", "b", "c", None])}
    return [(rnd.randint(1, 5), tuple(value[t]() for c, t in cols.items() if c != key), rnd.random() < 0.2)
            for _ in range(rnd.randint(3, 14))]


def batches_of(histories: dict[str, list], rnd: random.Random) -> tuple[list[dict], dict]:
    per_key, finals = {}, {}
    for table, changes in histories.items():
        # key_histories takes (key, a, b, delete) and makes rows (key, a, b): pass the other columns as one tuple
        per, final = key_histories([(k, rest, None, d) for k, rest, d in changes], table)
        per_key |= {(table, k): [[(t, kind, (row[0], *row[1])) for t, kind, row in msg] for msg in msgs]
                    for k, msgs in per.items()}
        finals[table] = [(k, *row[1]) for k, row in final.items()]
    delivered = deliver(per_key, rnd)
    out, i = [], 0
    while i < len(delivered):
        n = rnd.randint(1, 6)
        rows = [r for msg in delivered[i:i + n] for r in msg]
        out.append({t: _changelog(SCHEMAS[t], [(kind, row) for tt, kind, row in rows if tt == t]) for t in TABLES})
        i += n
    return out, finals


def _changelog(schema: pa.Schema, rows: list) -> pa.Table:
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in schema]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, schema)]
    return pa.Table.from_arrays(arrays + [pa.array([k for k, _ in rows], pa.int8())], names=schema.names + [KIND])


def _norm(row: dict) -> tuple:
    return tuple(round(v, 9) if isinstance(v, float) and not math.isnan(v) else v for v in row.values())


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 ])
@given(query=queries(), seed=st.integers(0, 2**32 - 1))
def test_a_random_sql_view_ends_equal_to_duckdb_over_the_final_state(tmp_path_factory, query, seed):
    sql, key = query
    rnd = random.Random(seed)
    p = Pipeline()
    for t, (cols, pk) in TABLES.items():
        p.source(t, columns=cols, primary_key=[pk])
    p.sql("v", sql).to_table("v", primary_key=key)
    plan = p.plan()
    batches, finals = batches_of({t: ops(t, rnd) for t in TABLES}, rnd)
    root = tmp_path_factory.mktemp("lake")
    sink = open_sink(TableSpec(name="v", path=str(root / "v"), primary_key=tuple(key),
                               nullable_key=plan["sink_v"].nullable_key), pipeline_id="sqlprop", engine="delta-rs")
    runner = LocalRunner(plan)
    for b, batch in enumerate(batches):
        changes = runner.step({s.source: batch[s.source] for s in plan.sources})["v"]
        sink.apply(sink_changes(changes, primary_key=tuple(key), batch_id=b), batch_id=b)
    names = plan["sink_v"].schema.names
    got = ({_norm(r) for r in read_delta(str(root / "v"), columns=names).to_pylist()}
           if (root / "v" / "_delta_log").exists() else set())
    con = duckdb.connect()
    for t, rows in finals.items():
        cols = list(zip(*rows)) if rows else [[] for _ in SCHEMAS[t]]
        con.register(t, pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, SCHEMAS[t])],
                                             names=SCHEMAS[t].names))
    want = {_norm(r) for r in con.sql(sql).to_arrow_table().to_pylist()}
    con.close()
    assert got == want, sql


def test_the_grammar_reaches_every_shape_and_subquery_kind():
    seen = set()

    @settings(max_examples=200, derandomize=True)
    @given(queries())
    def collect(q):
        text = q[0]
        seen.update(w for w in ("LEFT JOIN", "GROUP BY", "HAVING", "ROW_NUMBER", "PARTITION BY", "WITH", "NOT EXISTS",
                                " IN (SELECT", "CASE", "CAST", "COALESCE", "COUNT(DISTINCT", "AVG(") if w in text)

    collect()
    assert len(seen) == 13, seen
