"""Changing a running pipeline (docs/operations.md, "Changing a running pipeline"), through the CLI.

* A view added and one changed on an existing checkpoint: refused, naming the views and the fix; the fix,
  a new checkpoint on the lake the older checkpoint wrote: the changes produced since land in the mirrors
  and the views' tables (generation 1 writes after generation 0's batches, the views are recomputed and
  their tables replaced), equal to the batch query over the source's final state; the old checkpoint, run
  again with its views, is refused. (One test, one history: each run is a pipeline start.)
* The same with ``run --rebuild-views``: the views are rebuilt from the mirrored tables and continue from
  the old checkpoint's offsets (only the records produced since are read), also when the rebuild is killed
  in its first batch and restarted; a view over a source that is not mirrored is refused with the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import duckdb
import pyarrow as pa
import pytest
import yaml

import changelake.service.inventory as inv
from changelake.changelog import GENERATION_SPAN
from changelake.connectors.delta_read import read_delta
from changelake.service.config import load_config
from changelake.service.demo import verify

from .helpers import write_history
from .test_graph_pipeline import graph_config

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

JOIN = {"name": "enriched", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"}}}
BY_CATEGORY = {"name": "by_category", "from": "enriched", "group_by": ["category"],
               "aggregates": {"orders": "count(*)", "quantity": "sum(quantity)"}}
SETTINGS = {"spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}}
SALES = """SELECT p.category, count(*)::BIGINT AS orders, sum(o.quantity)::BIGINT AS quantity{extra}
           FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.category"""


def run(path, *, checkpoint: str | None = None, args: tuple[str, ...] = (),
        fault: str | None = None) -> subprocess.CompletedProcess:
    """``changelake run --available-now -c path`` (the checkpoint overridden from the environment; ``fault``:
    a kill point of changelake.service.pipeline)."""
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    if fault:
        env["CHANGELAKE_FAULT"] = fault
    if checkpoint:
        env["CHANGELAKE_PIPELINE__CHECKPOINT"] = checkpoint
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING", "run",
                           "--available-now", *args, "-c", str(path)], env=env, capture_output=True, text=True,
                          timeout=900)


def more_changes(db: inv.InventoryDatabase, servers: str, prefix: str, n: int) -> int:
    """``n`` further changes of the simulated database, new products among them; returns the messages sent."""
    msgs = [m for _ in range(n) for m in db.change(insert_ratio=0.3)]
    inv.produce((inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value) for m in msgs), servers)
    return len(msgs)


def truth(db, sql: str) -> set[tuple]:
    con = duckdb.connect()
    for name in ("orders", "products"):
        con.register(name, pa.Table.from_pylist(list(db.state[name].values())))
    rows = {tuple(r) for r in con.sql(sql).fetchall()}
    con.close()
    return rows


def table_rows(config, table: str, columns: list[str]) -> set[tuple]:
    return {tuple(r[c] for c in columns) for r in read_delta(config.table_path(table), columns=columns).to_pylist()}


def test_a_view_added_and_one_changed_are_refused_on_the_old_checkpoint_and_a_new_one_lands_them_and_refuses_the_old(
        kafka, tmp_path):
    """One history through four runs (each a pipeline start, a JVM): the first; a view added and one changed
    on its checkpoint (refused); a new checkpoint on the existing lake (the changes produced since land in
    the mirrors, both view tables are the new generation's and equal the batch query); the old checkpoint
    run again with its own views (refused: a newer checkpoint wrote the tables; nothing changed)."""
    prefix = kafka.topic("newck")
    db = write_history(kafka.bootstrap_servers, seed=11, changes=150, topic_prefix=prefix, redeliver=10,
                       sizes={"customers": 5, "products": 12, "orders": 30})
    graph = {"views": [JOIN, BY_CATEGORY], "tables": [{"name": "category_sales", "from": "by_category",
                                                         "primary_key": ["category"]}], "pipeline": SETTINGS}
    config, path = graph_config(kafka.bootstrap_servers, tmp_path, prefix, graph)
    first = run(path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert table_rows(config, "category_sales", ["category", "orders", "quantity"]) == truth(db, SALES.format(extra=""))

    generation0 = path.read_text()
    data = yaml.safe_load(generation0)                      # by_category changed, lines added
    data["views"][1]["aggregates"]["biggest"] = "max(quantity)"
    data["views"].append({"name": "lines", "from": "enriched", "select": ["order_id", "product_id", "category"]})
    data["tables"].append({"name": "order_lines", "from": "lines", "primary_key": ["order_id"]})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(path)
    more_changes(db, kafka.bootstrap_servers, prefix, 60)

    refused = run(path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "added: order_lines" in refused.stderr and "changed: category_sales" in refused.stderr
    assert "move the checkpoint directory away" in refused.stderr
    assert not (tmp_path / "lake" / "order_lines").exists(), "nothing written before the refusal"

    checkpoint = config.pipeline.checkpoint
    shutil.move(checkpoint, checkpoint + ".gen0")           # docs/operations.md: start a new checkpoint
    second = run(path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    assert table_rows(config, "category_sales", ["category", "orders", "quantity", "biggest"]) == truth(
        db, SALES.format(extra=", max(o.quantity)::BIGINT AS biggest"))
    assert table_rows(config, "order_lines", ["order_id", "product_id", "category"]) == truth(
        db, "SELECT o.order_id, o.product_id, p.category FROM orders o JOIN products p ON o.product_id = p.id")
    lineage = json.loads((tmp_path / "checkpoints" / config.pipeline.id / "changelake" / "lineage.json").read_text())
    assert lineage["generation"] == 1
    seqs = read_delta(config.table_path("category_sales"), columns=["_seq"])["_seq"].to_pylist()
    assert all(int(s[1:21]) >= GENERATION_SPAN for s in seqs), "every view row is the new generation's"

    path.write_text(generation0)        # the old checkpoint and its views, run again: refused (the lake is newer)
    stale = run(path, checkpoint=checkpoint + ".gen0")
    assert stale.returncode == 2, stale.stderr[-3000:]
    assert "newer checkpoint" in stale.stderr and "Changing a running pipeline" in stale.stderr
    assert verify(config, db.state) == {t: "ok" for t in db.state}


def test_rebuild_views_builds_a_view_added_and_one_changed_from_the_mirrored_tables_without_rereading(
        kafka, tmp_path):
    prefix = kafka.topic("rebuild")
    db = write_history(kafka.bootstrap_servers, seed=13, changes=150, topic_prefix=prefix, redeliver=10,
                       sizes={"customers": 5, "products": 12, "orders": 30})
    graph = {"views": [JOIN, BY_CATEGORY], "tables": [{"name": "category_sales", "from": "by_category",
                                                         "primary_key": ["category"]}], "pipeline": SETTINGS}
    config, path = graph_config(kafka.bootstrap_servers, tmp_path, prefix, graph)
    first = run(path)
    assert first.returncode == 0, first.stderr[-3000:]

    data = yaml.safe_load(path.read_text())                 # by_category changed, lines added
    data["views"][1]["aggregates"]["biggest"] = "max(quantity)"
    data["views"].append({"name": "lines", "from": "enriched", "select": ["order_id", "product_id", "category"]})
    data["tables"].append({"name": "order_lines", "from": "lines", "primary_key": ["order_id"]})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(path)
    sent = more_changes(db, kafka.bootstrap_servers, prefix, 40)

    crashed = run(path, args=("--rebuild-views",), fault="after-first-table@0")   # killed in its first batch
    assert crashed.returncode != 0
    rebuilt = run(path)                                      # the restart resumes the rebuild (no flag needed)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    # only the records produced since the old checkpoint's last batch were read: the views' input before
    # them came from the mirrored tables
    assert f"stopped after {sent:,} records" in rebuilt.stdout, (rebuilt.stdout, sent)
    assert table_rows(config, "category_sales", ["category", "orders", "quantity", "biggest"]) == truth(
        db, SALES.format(extra=", max(o.quantity)::BIGINT AS biggest"))
    assert table_rows(config, "order_lines", ["order_id", "product_id", "category"]) == truth(
        db, "SELECT o.order_id, o.product_id, p.category FROM orders o JOIN products p ON o.product_id = p.id")
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    checkpoint = config.pipeline.checkpoint
    lineage = json.loads((tmp_path / "checkpoints" / config.pipeline.id / "changelake" / "lineage.json").read_text())
    assert lineage["generation"] == 1 and lineage["rebuild"]["kept"] == checkpoint + ".gen0"
    assert os.path.isdir(checkpoint + ".gen0"), "the old checkpoint is kept"

    again = run(path, args=("--rebuild-views",))            # nothing changed: continues, reads nothing
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped after 0 records" in again.stdout, again.stdout

    data = yaml.safe_load(path.read_text())                 # products no longer mirrored, a view changed
    data["sources"] = [{k: v for k, v in s.items() if not (s["name"] == "products" and k == "table")}
                       for s in data["sources"]]
    data["tables"] = [t for t in data["tables"] if t["name"] != "products"]
    data["views"][1]["aggregates"]["smallest"] = "min(quantity)"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    refused = run(path, args=("--rebuild-views",))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "products are not mirrored" in refused.stderr and "sources[].table" in refused.stderr
    assert "starting_offsets: earliest" in refused.stderr and "move the checkpoint" in refused.stderr
    assert not os.path.isdir(checkpoint + ".gen1"), "nothing moved before the refusal"
