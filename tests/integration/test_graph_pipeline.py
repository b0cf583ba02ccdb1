"""The service runs an operator graph (YAML views) on Spark, exactly once across a SIGKILL.

Debezium JSON of the inventory database goes to the test broker; the service (``changelake
run --available-now`` in a child process) mirrors the three tables and runs
``orders JOIN products -> GROUP BY category -> top 3`` plus a materialized table keyed by
(product_id, order_id). The first run is killed with SIGKILL in the middle of batch 1, after one
table's Delta commit; the restart continues from the checkpoint (operator state included). The
graph tables must then equal the same query computed in batch by DuckDB over the source's final
state, and a further restart must change nothing (graph tables and mirrors).
"""

from __future__ import annotations

import signal

import duckdb
import pyarrow as pa
import pytest

from changelake.connectors.delta_read import read_delta
from changelake.service.demo import verify

from .helpers import pipeline_config, write_history
from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

VIEWS = [
    {"name": "enriched", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"}}},
    {"name": "by_category", "from": "enriched", "group_by": ["category"],
     "aggregates": {"orders": "count(*)", "quantity": "sum(quantity)"}},
    {"name": "top3", "from": "by_category",
     "top_n": {"n": 3, "order_by": ["quantity desc", "category"], "rank_column": "rnk"}},
    {"name": "lines", "from": "enriched", "select": ["order_id", "product_id", "category", "quantity"]},
]
GRAPH_TABLES = {
    "category_sales": (["category"], ["category", "orders", "quantity"]),
    "top_categories": (["rnk"], ["rnk", "category", "orders", "quantity"]),
    "order_lines": (["product_id", "order_id"], ["order_id", "product_id", "category", "quantity"]),
}
ORACLE = {
    "category_sales": """SELECT p.category, count(*)::BIGINT AS orders, sum(o.quantity)::BIGINT AS quantity
                         FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category""",
    "top_categories": """SELECT rnk, category, orders, quantity FROM (
                           SELECT *, row_number() OVER (ORDER BY quantity DESC, category)::BIGINT AS rnk
                           FROM ({category_sales})) WHERE rnk <= 3""",
    "order_lines": """SELECT o.order_id, o.product_id, p.category, o.quantity
                      FROM orders o JOIN products p ON o.product_id = p.id""",
}


def graph_config(servers: str, workdir, prefix: str, graph: dict):
    """The mirror pipeline of the integration tests plus ``graph`` (views, graph tables, settings)."""
    import yaml

    from changelake.service.config import load_config

    _, path = pipeline_config(servers, workdir, topic_prefix=prefix, max_records=150)
    data = yaml.safe_load(path.read_text())
    data["views"] = graph["views"]
    data["tables"] += graph["tables"]
    data["pipeline"].update(graph["pipeline"])
    for s in data["sources"]:
        s["primary_key"] = ["order_id" if s["name"] == "orders" else "id"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path), path


def _expected(db) -> dict[str, set[tuple]]:
    con = duckdb.connect()
    for name in ("orders", "products"):
        con.register(name, pa.Table.from_pylist(list(db.state[name].values())))
    out = {}
    for table, (_, columns) in GRAPH_TABLES.items():
        sql = ORACLE[table].format(category_sales=ORACLE["category_sales"])
        out[table] = {tuple(r) for r in con.sql(f"SELECT {', '.join(columns)} FROM ({sql})").fetchall()}
    con.close()
    return out


def _actual(config) -> dict[str, set[tuple]]:
    out = {}
    for table, (_, columns) in GRAPH_TABLES.items():
        rows = read_delta(config.table_path(table), columns=columns).to_pylist()
        out[table] = {tuple(r[c] for c in columns) for r in rows}
    return out


def test_graph_pipeline_sigkill_then_restart_equals_batch_query(kafka, tmp_path):
    prefix = kafka.topic("graph")
    db = write_history(kafka.bootstrap_servers, seed=5, changes=300, topic_prefix=prefix, redeliver=30,
                       sizes={"customers": 10, "products": 15, "orders": 40})
    graph = {"views": VIEWS, "tables": [{"name": t, "from": src, "primary_key": key} for (t, (key, _)), src in
                                        zip(GRAPH_TABLES.items(), ("by_category", "top3", "lines"))],
             "pipeline": {"spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}}}
    config, path = graph_config(kafka.bootstrap_servers, tmp_path, prefix, graph)
    want = _expected(db)
    assert all(want.values()), want

    crashed = _run_pipeline(path, fault="after-first-table@1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    committed = [t for t in GRAPH_TABLES if (tmp_path / "lake" / t).exists()]
    assert committed, "batch 0 should have been committed before the crash"
    assert _actual(config) != want, "the crash should leave the graph tables behind the source"

    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert _actual(config) == want
    assert verify(config, db.state) == {t: "ok" for t in db.state}     # the mirrors too

    again = _run_pipeline(path)            # a further restart finds nothing new to do
    assert again.returncode == 0, again.stderr[-3000:]
    assert _actual(config) == want
    assert verify(config, db.state) == {t: "ok" for t in db.state}
