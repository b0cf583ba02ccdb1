"""History tables end to end: ``changelake run --available-now`` (a child process) on the embedded
broker keeps SCD type 2 histories of two mirrors and of a graph view.

Debezium JSON of the inventory database (4 partitions per topic, so the batches read the changes of
one key out of order; the last messages redelivered) goes to the broker. ``customers`` is a history
table tracking every column, ``products`` one tracking ``category`` and ``price`` only, and
``category_history`` the history of a view counting products per category. The mirrors' histories
must equal the ones DuckDB computes from the produced messages alone (their binlog positions order
the changes); the view's current versions must equal the batch query over the final state, with
contiguous intervals. A second run changes nothing.
"""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest
import yaml

import changelake.service.inventory as inv
from changelake.connectors.delta_read import read_delta
from changelake.service.config import load_config

from .helpers import pipeline_config
from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

TRACKED = {"customers": ["first_name", "last_name", "email"], "products": ["category", "price"]}


def truth(messages: list[inv.Message], table: str) -> list[tuple]:
    """Per key, the versions (values..., how the version ended) in order, from the Debezium messages."""
    columns = list(inv.TABLES[table]["columns"])
    key = inv.TABLES[table]["key"]
    con = duckdb.connect()
    con.register("msgs", pa.table({"topic": [m.topic for m in messages],
                                   "v": [None if m.value is None else m.value.decode() for m in messages]}))
    image = ", ".join(f"CAST(img->>'{c}' AS BIGINT) AS {c}" if c == key else f"(img->>'{c}') AS {c}"
                      for c in columns)
    changed = " OR ".join(f"p_{c} IS DISTINCT FROM {c}" for c in TRACKED[table])
    lags = ", ".join(f"lag({c}) OVER w AS p_{c}" for c in TRACKED[table])
    con.sql(f"""
        CREATE TABLE ev AS
        WITH m AS (
            SELECT v->>'$.op' AS op, CAST(v->>'$.source.pos' AS BIGINT) AS pos,
                   CASE WHEN v->>'$.op' = 'd' THEN v->'$.before' ELSE v->'$.after' END AS img
            FROM msgs WHERE topic LIKE '%.{table}' AND v IS NOT NULL)
        SELECT DISTINCT pos, op = 'd' AS deleted, {image} FROM m""")
    rows = con.sql(f"""
        WITH st AS (SELECT *, lag(deleted) OVER w AS p_deleted, {lags}
               FROM ev WINDOW w AS (PARTITION BY {key} ORDER BY pos)),
        edge AS (SELECT * FROM st WHERE (deleted AND p_deleted = false)
                                     OR (NOT deleted AND (p_deleted IS NULL OR p_deleted OR {changed}))),
        ver AS (SELECT *, lead(pos) OVER (PARTITION BY {key} ORDER BY pos) AS end_pos,
                       lead(deleted) OVER (PARTITION BY {key} ORDER BY pos) AS ended_by_delete FROM edge)
        SELECT {key}, pos, end_pos, ended_by_delete FROM ver WHERE NOT deleted ORDER BY {key}, pos
    """).fetchall()
    # the values of a version: those of its last change (an untracked column is written in place)
    last = con.sql(f"SELECT {', '.join(columns)}, pos FROM ev WHERE NOT deleted").fetchall()
    by_key: dict = {}
    for r in last:
        by_key.setdefault(str(r[columns.index(key)]), []).append(r)
    out = []
    for k, start, end, by_delete in rows:
        inside = [r for r in by_key[str(k)] if r[-1] >= start and (end is None or r[-1] < end)]
        values = max(inside, key=lambda r: r[-1])[:-1]
        out.append((*[None if v is None else str(v) for v in values],
                    "open" if end is None else "deleted" if by_delete else "next"))
    return out


def ours(path: str, table: str) -> list[tuple]:
    columns = list(inv.TABLES[table]["columns"])
    key = inv.TABLES[table]["key"]
    rows = read_delta(path).to_pylist()
    starts = {(r[key], r["__start_at"]) for r in rows}
    out = []
    for r in sorted(rows, key=lambda r: (r[key], r["__start_at"])):
        end = r["__end_at"]
        how = "open" if end is None else "next" if (r[key], end) in starts else "deleted"
        out.append((*[None if r[c] is None else _text(r[c]) for c in columns], how))
    return out


def _text(value) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else \
        json.dumps(value) if isinstance(value, float) else str(value)


def test_mirror_and_view_histories_equal_duckdb_and_a_rerun_changes_nothing(kafka, tmp_path):
    prefix = kafka.topic("history")
    db = inv.InventoryDatabase(seed=31)
    messages = list(db.history(snapshot_sizes={"customers": 12, "products": 15, "orders": 5}, changes=400,
                               redeliver=40))
    inv.produce((inv.Message(m.topic.replace(inv.SERVER, prefix, 1), m.key, m.value) for m in messages),
                kafka.bootstrap_servers)
    _, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=120)
    raw = yaml.safe_load(path.read_text())
    for t in raw["tables"]:
        if t["name"] == "customers":
            t["history"] = "scd2"
        if t["name"] == "products":
            t.update(history="scd2", track_history=TRACKED["products"])
    for s in raw["sources"]:
        s["primary_key"] = [inv.TABLES[s["name"]]["key"]]
    raw["views"] = [{"name": "per_category", "from": "products", "group_by": ["category"],
                     "aggregates": {"products": "count(*)"}}]
    raw["tables"].append({"name": "category_history", "from": "per_category", "primary_key": ["category"],
                          "history": "scd2"})
    raw["pipeline"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(path)

    run = _run_pipeline(path)
    assert run.returncode == 0, run.stderr[:6000]
    for table in ("customers", "products"):
        expected = truth(messages, table)
        assert ours(config.table_path(table), table) == expected, table
        assert sum(1 for v in expected if v[-1] == "deleted") > 0 and sum(1 for v in expected if v[-1] == "next") > 0

    views = read_delta(config.table_path("category_history")).to_pylist()
    current = {(r["category"], r["products"]) for r in views if r["__end_at"] is None}
    final: dict[str, int] = {}
    for row in db.state["products"].values():
        final[row["category"]] = final.get(row["category"], 0) + 1
    assert current == set(final.items())
    by_start = {(r["category"], r["__start_at"]): r for r in views}
    for r in views:                    # a version ends where the category's count changed (or it vanished)
        following = by_start.get((r["category"], r["__end_at"]))
        assert following is None or following["products"] != r["products"], (r, following)
    assert len(views) > len(current), "the view's history should hold earlier counts"

    before = {t: read_delta(config.table_path(t)).num_rows for t in ("customers", "products", "category_history")}
    again = _run_pipeline(path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {t: read_delta(config.table_path(t)).num_rows for t in before} == before
    assert ours(config.table_path("customers"), "customers") == truth(messages, "customers")
