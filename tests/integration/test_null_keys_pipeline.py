"""NULL group and partition keys end to end on Spark, as SQL has them (issue #11, item 5).

Products whose category is NULL (inserted so, or updated to and from NULL) go through the service
(``changelake run --available-now``, several micro-batches): ``orders JOIN products GROUP BY
category``, ``products GROUP BY category`` and a Top-2 per category. The NULL category is one
group and one Top-N partition in the tables, as DuckDB computes over the source's final state; a
NULL primary key of a mirrored source stays a dead letter (the mirror is verified as usual).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import changelake.service.inventory as inv
from changelake.connectors.delta_read import read_delta
from changelake.service.demo import verify
from changelake.service.inventory import InventoryDatabase, produce

from .test_crash_recovery import _run_pipeline
from .test_graph_pipeline import graph_config

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

VIEWS = [
    {"name": "enriched", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"}}},
    {"name": "revenue", "from": "enriched", "group_by": ["category"],
     "aggregates": {"orders": "count(*)", "quantity": "sum(quantity)"}},
    {"name": "per_category", "from": "products", "group_by": ["category"],
     "aggregates": {"products": "count(*)", "top_price": "max(price)"}},
    {"name": "top2", "from": "products",
     "top_n": {"n": 2, "order_by": ["price desc", "id"], "partition_by": ["category"], "rank_column": "rn"}},
]
#: table -> (view, primary key, columns, DuckDB query over the final state)
TABLES = {
    "revenue_by_category": ("revenue", ["category"], ["category", "orders", "quantity"],
                            """SELECT p.category, count(*), sum(o.quantity)
                               FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category"""),
    "products_by_category": ("per_category", ["category"], ["category", "products", "top_price"],
                             "SELECT category, count(*), max(price) FROM products GROUP BY category"),
    "top_products": ("top2", ["category", "rn"], ["category", "rn", "id", "price"],
                     """SELECT category, rn, id, price FROM (
                          SELECT *, row_number() OVER (PARTITION BY category ORDER BY price DESC, id) AS rn
                          FROM products) WHERE rn <= 2"""),
}


class NullCategories(InventoryDatabase):
    """The inventory database, with products whose category is NULL or becomes (or stops being) NULL."""

    def _product(self, i: int) -> dict:
        row = super()._product(i)
        if self.rng.random() < 0.3:
            row["category"] = None
        return row

    def _changed(self, table: str, row: dict) -> dict:
        new = super()._changed(table, row)
        if table == "products" and self.rng.random() < 0.25:
            new["category"] = None if new["category"] is not None else "tools"
        return new


def test_null_group_and_partition_keys_end_equal_to_sql(kafka, tmp_path):
    prefix = kafka.topic("nullkeys")
    db = NullCategories(seed=11)
    history = db.history(snapshot_sizes={"customers": 5, "products": 30, "orders": 40}, changes=200, redeliver=20)
    produce((inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value) for m in history),
            kafka.bootstrap_servers)
    graph = {"views": VIEWS,
             "tables": [{"name": t, "from": view, "primary_key": key} for t, (view, key, _, _) in TABLES.items()],
             "pipeline": {"spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}}}
    config, path = graph_config(kafka.bootstrap_servers, tmp_path, prefix, graph)

    con = duckdb.connect()
    for name in ("orders", "products"):
        con.register(name, pa.Table.from_pylist(list(db.state[name].values())))
    want = {t: {tuple(r) for r in con.sql(sql).fetchall()} for t, (_, _, _, sql) in TABLES.items()}
    con.close()
    assert all(any(r[0] is None for r in rows) for rows in want.values()), "every table should have a NULL group"

    run = _run_pipeline(path)
    assert run.returncode == 0, run.stderr[-3000:]
    for table, (_, _, columns, _) in TABLES.items():
        rows = read_delta(config.table_path(table), columns=columns).to_pylist()
        assert {tuple(r[c] for c in columns) for r in rows} == want[table], table
    assert verify(config, db.state) == {t: "ok" for t in db.state}     # the mirrors, products' NULLs included
