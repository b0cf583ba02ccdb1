"""A whole database through one routed source: one YAML file, the test broker, real Delta tables.

50 source tables: 40 plain ones, ``orders_0..5`` (keys kept apart) merged into ``orders``,
``events_0..2`` (the same keys in every shard) merged into ``events`` with origin columns, and
one more table whose topic is created while the pipeline runs. The plain tables' columns change in the
middle of the history (ADD COLUMN, INT to BIGINT, DROP COLUMN; ``schema_change: evolve``), and the topics
have 4 partitions (keys partitioned as Debezium does), read in small batches, with re-delivered messages:
a partition behind the others, or a re-delivered message, brings an older schema after the table took a
newer one. Every target table must equal the source's final state, and no table is quarantined; bad
messages are dead letters of their own table and counted per table; a restarted pipeline goes on from
where it stopped, creating no table twice.
"""

from __future__ import annotations

import time

import pytest
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable

from changelake import metrics
from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.service.runner import wait_for
from tests.routed_history import RoutedDatabase, produce

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

PLAIN = {f"t{i:02d}": (1, 1) for i in range(40)}
ORDERS = {f"orders_{i}": (i, 6) for i in range(6)}
EVENTS = {f"events_{i}": (1, 1) for i in range(3)}

PIPELINE = """
pipeline: {id: %(id)s, checkpoint: %(dir)s/checkpoint, trigger_interval: 1 second,
           max_records_per_batch: %(max_records)s}
kafka: {bootstrap_servers: "%(servers)s"}
storage: {root: %(dir)s/lake}
metrics: {port: 0}
sources:
  - name: shop
    topic_pattern: '%(prefix)s\\.shop\\..*'
    format: debezium-json
    schema_change: evolve
    route:
      - source_table: 'shop\\.orders_\\d+'        # sharded, ids unique across the shards
        table: orders
        properties: {delta.enableChangeDataFeed: "true"}
      - source_table: 'shop\\.(events)_\\d+'      # sharded, the same ids in every shard
        table: $1
        origin_columns: true
      - source_table: 'shop\\.(.*)'
        table: shop_<>
        replace_symbol: <>
        partition_by: [flag]
"""


def _write_config(path, prefix: str, workdir, servers: str, *, max_records: int):
    path.write_text(PIPELINE % {"id": prefix, "dir": workdir, "servers": servers, "prefix": prefix,
                                "max_records": max_records})
    return parse_config(path.read_text(), origin=str(path))


def _table(path: str, key: list[str]) -> dict[tuple, dict]:
    rows = read_delta(path).to_pylist()
    return {tuple(r[k] for k in key): {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}


def _expected(db: RoutedDatabase) -> dict[str, tuple[list[str], dict]]:
    out = {}
    if set(ORDERS) & set(db.state):
        out["orders"] = (["id"], db.expected(list(ORDERS)))
    if set(EVENTS) & set(db.state):
        out["events"] = (["id", "source_db", "source_table"], db.expected(list(EVENTS), origin=True))
    for t in db.state:
        if t not in ORDERS and t not in EVENTS:
            out[f"shop_{t}"] = (["id"], db.expected([t]))
    return out


def _mismatches(config, db: RoutedDatabase) -> list[str]:
    root = config.storage.root
    bad = []
    for name, (key, rows) in _expected(db).items():
        if not DeltaTable.is_deltatable(f"{root}/{name}") or _table(f"{root}/{name}", key) != rows:
            bad.append(name)
    return bad


def test_a_50_table_database_routes_to_its_tables_with_a_topic_created_while_running(spark, kafka, tmp_path):
    prefix = kafka.topic("routed").replace("-", "_")
    db = RoutedDatabase(prefix=prefix, seed=50)
    messages = db.history({**PLAIN, **ORDERS, **EVENTS}, changes=100, redeliver=0)
    messages += db.more(400, redeliver=40, earlier=messages, ddl=0.15, alterable=tuple(PLAIN))
    assert len(db.ddl_log) > 10
    produce(messages, kafka.bootstrap_servers)
    # bad input: an update without its before-image (t07), not JSON (t08), a message naming no table
    broken = db._message("t07", "u", 1, None, {"id": 1, "name": "x", "big": 1, "ratio": 1.0, "flag": True})
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    p.produce(broken.topic, key=broken.key, value=broken.value)
    p.produce(db.topic("t08"), key=b'{"id": 1}', value=b"{truncated")
    p.produce(db.topic("t09"), key=b'{"id": 1}', value=b'{"op": "c", "after": {"id": 1}}')
    p.flush(30)

    path = tmp_path / "pipeline.yaml"
    config = _write_config(path, prefix, tmp_path, kafka.bootstrap_servers, max_records=120)
    bad_before = {t: metrics.REGISTRY.get_sample_value("changelake_table_bad_records_total",
                                                       {"table": t, "reason": r, "action": "dlq"}) or 0
                  for t, r in (("shop_t07", "missing-before"), ("", "unrouted"))}
    unrouted = bad_before[""]

    processor = BatchProcessor(config, spark=spark)
    started = time.monotonic()
    query = start_query(spark, config, processor)
    try:
        assert wait_for(lambda: len(processor.routed_tables) == 42 and not _mismatches(config, db), timeout_s=300,
                    interval_s=3), \
            (sorted(processor.routed_tables), _mismatches(config, db), query.exception())
        first_pass = time.monotonic() - started
        # a table whose topic appears while the pipeline runs
        produce(db.history({"late_table": (1, 1)}, changes=20, redeliver=3), kafka.bootstrap_servers)
        assert wait_for(lambda: "shop_late_table" in processor.routed_tables and not _mismatches(config, db),
                        timeout_s=120, interval_s=3), (_mismatches(config, db), query.exception())
        assert not processor.quarantine.tables, processor.quarantine.tables
    finally:
        query.stop()
    print(f"routed 49 source tables into 42 in {first_pass:.1f} s; then the 50th, created while running")

    assert len(db.state) == 50 and len(processor.routed_tables) == 43
    assert DeltaTable(f"{config.storage.root}/orders").metadata().configuration[
        "delta.enableChangeDataFeed"] == "true"
    assert DeltaTable(f"{config.storage.root}/shop_t00").metadata().partition_columns == ["flag"]
    letters = read_delta(config.dead_letter_path()).to_pylist()
    assert sorted((r["reason"], r["table"], r["topic"]) for r in letters) == [
        ("malformed", None, db.topic("t08")), ("missing-before", "shop_t07", db.topic("t07")),
        ("unrouted", None, db.topic("t09"))]
    assert metrics.REGISTRY.get_sample_value(
        "changelake_table_bad_records_total",
        {"table": "shop_t07", "reason": "missing-before", "action": "dlq"}) - bad_before["shop_t07"] == 1
    assert metrics.REGISTRY.get_sample_value(
        "changelake_table_bad_records_total", {"table": "", "reason": "unrouted", "action": "dlq"}) - unrouted == 1
    assert metrics.REGISTRY.get_sample_value("changelake_changes_in_total", {"table": "shop_late_table",
                                                                             "kind": "+I"}) >= 3

    # a restart goes on from the checkpoint: the tables and their keys are found again, nothing twice
    produce(db.more(60, redeliver=10, ddl=0.1, alterable=tuple(PLAIN)), kafka.bootstrap_servers)
    again = BatchProcessor(config, spark=spark)
    start_query(spark, config, again, available_now=True).awaitTermination()
    assert _mismatches(config, db) == [] and not again.quarantine.tables
    assert again.totals.records <= 60 + 30 + 10          # only what came after the stop (deletes add tombstones)
    assert again.keys.key_of("events") == ("id", "source_db", "source_table")


def test_sigkill_mid_batch_then_restart_applies_each_routed_change_once(kafka, tmp_path):
    """The process dies after the first routed table of batch 1 committed and before the others; the
    restarted pipeline replays batch 1 (the committed table skips it) and goes on."""
    import signal

    from .test_crash_recovery import _run_pipeline

    prefix = kafka.topic("routed_crash").replace("-", "_")
    db = RoutedDatabase(prefix=prefix, seed=9)
    tables = {**{f"t{i:02d}": (1, 1) for i in range(4)}, "orders_0": (0, 2), "orders_1": (1, 2),
              "events_0": (1, 1), "events_1": (1, 1)}
    messages = db.history(tables, changes=50, redeliver=0)
    messages += db.more(350, redeliver=30, earlier=messages, ddl=0.1, alterable=tuple(t for t in tables if t[0] == "t"))
    produce(messages, kafka.bootstrap_servers)
    path = tmp_path / "pipeline.yaml"
    config = _write_config(path, prefix, tmp_path, kafka.bootstrap_servers, max_records=150)

    crashed = _run_pipeline(path, fault="after-first-table@1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert _mismatches(config, db) != []
    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert _mismatches(config, db) == []
