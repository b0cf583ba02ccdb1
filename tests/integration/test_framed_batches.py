"""Batches reduced on the executors (``storage.reduce_on: executors``) write what collected batches write.

The tables' changes are left on the executors, reduced there and handed to the sink as DataFrames
(the delta-rs engine then collects one row per key), in this test process's Spark session. Real
topics on the test broker, real Delta tables; a history run both ways into two lakes is
compared row for row.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.demo import demo_config, expected_views, verify, verify_views
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.spark.groups import MARKER, GroupLayout

from .helpers import write_history

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

MIRRORS = ("customers", "products", "orders")
GRAPH = ("sales_by_category", "top_categories")


def _run(spark, config) -> BatchProcessor:
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    return processor


def _parse(raw: dict, workdir: Path):
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path))


def _demo(servers: str, workdir: Path, prefix: str, reduce_on: str):
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"it-{prefix}",
                      max_records_per_batch=150, views=True)
    for source in raw["sources"]:
        source["topics"] = [t.replace("dbserver1", prefix, 1) for t in source["topics"]]
    raw["storage"]["reduce_on"] = reduce_on
    raw["pipeline"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2"}
    return _parse(raw, workdir)


def _table(path: str, *, without: tuple[str, ...] = ()) -> list[tuple]:
    rows = read_delta(path).to_pylist()
    return sorted((tuple((k, repr(v)) for k, v in sorted(r.items()) if k not in without) for r in rows))


def test_mirror_and_graph_tables_reduced_on_the_executors_equal_the_source_and_the_views_in_batch(
        spark, kafka, tmp_path):
    """The demo pipeline (three mirrors; join -> aggregate -> top-N) with every table framed, over
    several batches of an inventory history with redeliveries: the mirrors equal the simulated
    database, the graph tables the same query computed in batch over its final state. (The driver
    path is held to the same oracles by the other integration tests; the test below compares the
    two paths row for row.)"""
    prefix = kafka.topic("framed")
    db = write_history(kafka.bootstrap_servers, seed=31, changes=150, topic_prefix=prefix, redeliver=30,
                       sizes={"customers": 10, "products": 15, "orders": 30})
    framed = _demo(kafka.bootstrap_servers, tmp_path / "framed", prefix, "executors")

    on_executors = _run(spark, framed)

    assert set(on_executors.framed_tables()) == {*MIRRORS, *GRAPH}
    # a new checkpoint spreads the state buckets over the session's 2 shuffle partitions, and records it
    assert on_executors.query.groups == GroupLayout(2)
    assert json.loads((Path(framed.pipeline.checkpoint) / MARKER).read_text()) == {"layout": "balanced", "partitions": 2,
                                                                                   "stages": "level"}
    assert on_executors.totals.batch_id >= 1 and on_executors.last_report.framed_tables
    assert verify(framed, db.state) == {t: "ok" for t in db.state}
    assert verify_views(framed, expected_views(db.state)) == {t: "ok" for t in GRAPH}
    assert set(on_executors.totals.changes) == {*MIRRORS, *GRAPH} and not on_executors.totals.dead_letters


# --- null keys, truncates, out-of-order and redelivered changes, a replayed batch ---------------------

def _event(op: str, pos: int, row: dict | None) -> bytes:
    source = {"connector": "mysql", "db": "shop", "table": "orders", "file": "mysql-bin.000007", "pos": pos,
              "row": 0, "ts_ms": 1_700_000_000_000}
    before = row if op == "d" else {**row, "amount": 0} if op == "u" else None
    return orjson.dumps({"op": op, "before": before, "after": None if op in ("d", "t") else row,
                         "source": source, "ts_ms": 1_700_000_000_000})


def _orders_config(servers: str, workdir: Path, topic: str, reduce_on: str):
    columns = {"id": "bigint", "amount": "bigint", "note": "string"}
    return _parse({
        "pipeline": {"id": f"it-{topic}", "checkpoint": str(workdir / "ckpt"), "max_records_per_batch": 20,
                     "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "kafka": {"bootstrap_servers": servers},
        "storage": {"root": str(workdir / "lake"), "reduce_on": reduce_on},
        "metrics": {"port": 0},
        "sources": [{"name": "orders", "topics": [topic], "columns": columns, "table": "orders",
                     "on_truncate": "apply", "on_error": "dlq"}],
        "tables": [{"name": "orders", "primary_key": ["id"]}],
    }, workdir)


def _dead_letters(config) -> list[tuple]:
    rows = read_delta(config.dead_letter_path(), columns=["topic", "partition", "offset", "reason"]).to_pylist()
    return sorted((r["topic"], r["partition"], r["offset"], r["reason"]) for r in rows)


def test_null_keys_truncates_and_a_replayed_batch_reduced_on_the_executors(spark, kafka, tmp_path):
    topic = kafka.topic("framed-orders", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    events = []      # (partition, op, binlog position, row)
    for i in range(1, 31):
        events.append((i % 2, "c", 100 * i, {"id": i, "amount": i, "note": f"n{i} ä😀"}))
    events += [(0, "c", 3050, {"id": None, "amount": 1, "note": "no key"}),          # null key: a dead letter
               (1, "u", 3100, {"id": 3, "amount": 33, "note": "newer"}),
               (0, "u", 2900, {"id": 3, "amount": -3, "note": "older, delivered later"}),   # out of order
               (1, "d", 3200, {"id": 4, "amount": 4, "note": None}),
               (1, "c", 400, {"id": 4, "amount": 4, "note": "n4 ä😀"}),               # redelivered, before the delete
               (0, "u", 3300, {"id": 5, "amount": 55, "note": "x"}),
               (0, "u", 3300, {"id": 5, "amount": 55, "note": "x"})]                   # redelivered
    events += [(0, "t", 5000, None)]                                                    # truncate at 5000
    events += [(0, "c", 4990, {"id": 98, "amount": 98, "note": "before the truncate"}),
               (0, "c", 6000, {"id": 100, "amount": 100, "note": "after"}),
               (0, "c", 6100, {"id": None, "amount": 2, "note": "no key again"}),
               (0, "u", 6200, {"id": 100, "amount": 101, "note": "after, updated"})]
    for partition, op, pos, row in events:
        key = None if row is None or row["id"] is None else orjson.dumps({"id": row["id"]})
        producer.produce(topic, key=key, value=_event(op, pos, row), partition=partition)
    producer.flush(30)

    collected = _orders_config(kafka.bootstrap_servers, tmp_path / "collected", topic, "driver")
    framed = _orders_config(kafka.bootstrap_servers, tmp_path / "framed", topic, "executors")
    on_driver = _run(spark, collected)
    on_executors = _run(spark, framed)

    rows = {r["id"]: (r["amount"], r["note"]) for r in read_delta(framed.table_path("orders")).to_pylist()}
    assert rows == {100: (101, "after, updated")}
    assert _table(framed.table_path("orders")) == _table(collected.table_path("orders"))
    letters = _dead_letters(framed)
    assert [letter[3] for letter in letters] == ["missing-key", "missing-key"]
    assert letters == _dead_letters(collected)
    assert on_executors.totals.dead_letters == on_driver.totals.dead_letters == {"missing-key": 2}
    assert on_executors.totals.truncates == on_driver.totals.truncates == {"orders": 1}
    assert on_executors.totals.changes == on_driver.totals.changes
    assert "orders" in on_executors.framed_tables()

    # a crash after the Delta commits and before Spark recorded the batch: the restart replays it, and
    # the sink's transaction id (pipeline, table, batch id) makes the replay write nothing
    last = on_executors.totals.batch_id
    version = read_delta_version(framed.table_path("orders"))
    commits = Path(framed.pipeline.checkpoint) / "commits"
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    replay = _run(spark, framed)
    assert replay.last_report.batch_id == last and replay.last_report.framed_tables == ["orders"]
    assert replay.last_report.committed_tables == []
    assert read_delta_version(framed.table_path("orders")) == version
    assert _table(framed.table_path("orders")) == _table(collected.table_path("orders"))
    assert _dead_letters(framed) == letters


def read_delta_version(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).version()
