"""The service runs the interval and the temporal join from YAML, across a restart, late rows included.

Debezium JSON on the test broker: orders (append-only facts), shipments (append-only) and
currency rates (a versioned table: creates, updates, a delete and a re-create, whose event time is
the change's operation time from the Debezium source block). Each topic's messages share one key,
so they are read in event-time order. The first run (availableNow) consumes ten hours of event
time, in micro-batches of 40 records, so rows are joined, padded and dropped from the state on the
way. Then late rows (two days old) and far-future sentinels go in, and a second run continues from
the checkpoint: the sentinels move the watermark past everything, so every window closes. The
tables must equal DuckDB's batch join over the in-time rows; the late rows must be dead letters
(interval join, late_rows: dead_letter) or counted only (temporal join, late_rows: drop).
"""

from __future__ import annotations

import json
import random

import duckdb
import orjson
import pyarrow as pa
import pytest

import changelake.service.inventory as inv
from changelake.connectors.delta_read import read_delta
from changelake import metrics
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query

from .helpers import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

T0 = 1_767_225_600_000                      # 2026-01-01T00:00:00Z, ms
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def _message(topic: str, op: str, before: dict | None, after: dict | None, at: int) -> inv.Message:
    value = {"before": before, "after": after, "op": op, "ts_ms": at, "source": {"ts_ms": at}}
    return inv.Message(topic, b"all", orjson.dumps(value))


def _history(rng: random.Random):
    orders, ships, versions = [], [], []
    for i in range(1, 61):
        orders.append({"order_id": i, "currency": rng.choice(["EUR", "USD", "GBP"]), "amount": rng.randint(1, 99),
                       "ts": T0 + i * 10 * MIN})
        if rng.random() < 0.7:                                   # shipped 0..4 h after the order: the
            ships.append({"ship_id": 1000 + i, "order_id": i,    # window is 3 h, so some miss it
                          "ts": orders[-1]["ts"] + rng.randint(0, 4 * HOUR)})
    ships.sort(key=lambda s: s["ts"])
    rate = {"EUR": 1.0, "USD": 0.9, "GBP": 1.2}
    for c in rate:
        versions.append(("c", None, {"currency": c, "rate": rate[c]}, T0 - HOUR))
    for step in range(1, 12):
        c = rng.choice(list(rate))
        old, rate[c] = {"currency": c, "rate": rate[c]}, round(rate[c] + rng.uniform(-0.1, 0.1), 3)
        versions.append(("u", old, {"currency": c, "rate": rate[c]}, T0 + step * 50 * MIN))
    versions.append(("d", {"currency": "GBP", "rate": rate["GBP"]}, None, T0 + 5 * HOUR + 5 * MIN))
    versions.append(("c", None, {"currency": "GBP", "rate": 2.0}, T0 + 7 * HOUR + 5 * MIN))
    versions.sort(key=lambda v: v[3])
    return orders, ships, versions


def _config(servers, tmp_path, prefix):
    sources = [
        {"name": "orders", "topics": [f"{prefix}.orders"], "append_only": True, "event_time": "ts",
         "watermark_delay": "1 hour", "columns": {"order_id": "bigint", "currency": "string", "amount": "bigint",
                                                  "ts": "bigint"}},
        {"name": "shipments", "topics": [f"{prefix}.shipments"], "append_only": True, "event_time": "ts",
         "watermark_delay": "1 hour", "columns": {"ship_id": "bigint", "order_id": "bigint", "ts": "bigint"}},
        {"name": "rates", "topics": [f"{prefix}.rates"], "primary_key": ["currency"], "event_time": "op_ts",
         "watermark_delay": "1 hour", "columns": {"currency": "string", "rate": "double"},
         "options": {"metadata": {"source.timestamp": "op_ts"}}},
    ]
    views = [
        {"name": "shipped", "interval_join": {"left": "orders", "right": "shipments", "on": {"order_id": "order_id"},
                                              "before": "3 hours", "after": "0 seconds", "how": "left",
                                              "late_rows": "dead_letter"}},
        {"name": "shipped_rows", "from": "shipped",
         "select": {"order_id": "order_id", "ship_id": "coalesce(ship_id, -1)", "shipped_at": "shipments_ts"}},
        {"name": "priced", "temporal_join": {"left": "orders", "right": "rates", "on": {"currency": "currency"},
                                             "how": "left"}},
        {"name": "priced_rows", "from": "priced", "select": ["order_id", "currency", "amount", "rate"]},
    ]
    tables = [{"name": "shipped", "from": "shipped_rows", "primary_key": ["order_id", "ship_id"]},
              {"name": "priced", "from": "priced_rows", "primary_key": ["order_id"]}]
    config, _ = pipeline_config(servers, tmp_path, topic_prefix=prefix, max_records=40,
                                overrides={"sources": sources, "views": views, "tables": tables})
    return config


def _expected(orders, ships, versions) -> dict[str, set[tuple]]:
    con = duckdb.connect()
    con.register("orders", pa.Table.from_pylist(orders))
    con.register("ships", pa.Table.from_pylist(ships))
    con.register("versions", pa.Table.from_pylist(
        [{"currency": (a or b)["currency"], "rate": None if a is None else a["rate"], "vt": t, "seq": i}
         for i, (_, b, a, t) in enumerate(versions)]))
    shipped = con.sql(f"""SELECT o.order_id, coalesce(s.ship_id, -1), s.ts FROM orders o LEFT JOIN ships s
                          ON o.order_id = s.order_id AND o.ts BETWEEN s.ts - {3 * HOUR} AND s.ts""").fetchall()
    priced = con.sql("""SELECT o.order_id, o.currency, o.amount,
                          (SELECT v.rate FROM versions v WHERE v.currency = o.currency AND v.vt <= o.ts
                           ORDER BY v.vt DESC, v.seq DESC LIMIT 1)
                        FROM orders o""").fetchall()
    return {"shipped": set(shipped), "priced": set(priced)}


def _late(view: str, side: str) -> float:
    return metrics.REGISTRY.get_sample_value("changelake_late_rows_total", {"view": view, "side": side}) or 0


def test_interval_and_temporal_join_from_yaml_across_a_restart(spark, kafka, tmp_path):
    prefix = kafka.topic("timejoins")
    orders, ships, versions = _history(random.Random(7))
    topic = {name: f"{prefix}.{name}" for name in ("orders", "shipments", "rates")}
    inv.produce([_message(topic["orders"], "c", None, o, o["ts"]) for o in orders]
                + [_message(topic["shipments"], "c", None, s, s["ts"]) for s in ships]
                + [_message(topic["rates"], op, b, a, t) for op, b, a, t in versions], kafka.bootstrap_servers)
    config = _config(kafka.bootstrap_servers, tmp_path, prefix)

    first = BatchProcessor(config, spark=spark)
    start_query(spark, config, first, available_now=True).awaitTermination()
    assert first.totals.batch_id >= 3, "ten hours of event time should take several micro-batches"
    # rows whose windows closed in the first run are in; the last hours wait for the watermark
    partial = {tuple(r.values()) for r in read_delta(config.table_path("priced")).to_pylist()}
    assert 0 < len(partial) < len(orders)

    late_before = {k: _late(*k) for k in (("shipped", "left"), ("shipped", "right"), ("priced", "left"))}
    late_order = {"order_id": 500, "currency": "EUR", "amount": 1, "ts": T0 - 2 * DAY}
    late_ship = {"ship_id": 5000, "order_id": 7, "ts": T0 - 2 * DAY}
    future = T0 + 365 * DAY
    inv.produce([_message(topic["orders"], "c", None, late_order, late_order["ts"]),
                 _message(topic["shipments"], "c", None, late_ship, late_ship["ts"]),
                 _message(topic["orders"], "c", None, {"order_id": 9999, "currency": "XXX", "amount": 0, "ts": future},
                          future),
                 _message(topic["shipments"], "c", None, {"ship_id": 9999, "order_id": 9998, "ts": future}, future),
                 _message(topic["rates"], "c", None, {"currency": "XXX", "rate": 0.0}, future)],
                kafka.bootstrap_servers)
    second = BatchProcessor(config, spark=spark)
    start_query(spark, config, second, available_now=True).awaitTermination()

    want = _expected(orders, ships, versions)
    got = {"shipped": {(r["order_id"], r["ship_id"], r["shipped_at"])
                       for r in read_delta(config.table_path("shipped")).to_pylist()},
           "priced": {(r["order_id"], r["currency"], r["amount"], r["rate"])
                      for r in read_delta(config.table_path("priced")).to_pylist()}}
    assert got == want
    assert any(r[1] == -1 for r in want["shipped"]) and any(r[3] is None for r in want["priced"]), \
        "the history should leave unshipped orders and orders without a rate (GBP was deleted for 2 h)"

    letters = read_delta(config.dead_letter_path()).to_pylist()
    assert sorted((d["source"], json.loads(d["value"])["order_id" if d["source"] == "orders" else "ship_id"])
                  for d in letters) == [("orders", 500), ("shipments", 5000)]
    assert {d["reason"] for d in letters} == {"late"} and all("view 'shipped'" in d["error"] for d in letters)
    assert _late("shipped", "left") == late_before[("shipped", "left")] + 1
    assert _late("shipped", "right") == late_before[("shipped", "right")] + 1
    assert _late("priced", "left") == late_before[("priced", "left")] + 1
