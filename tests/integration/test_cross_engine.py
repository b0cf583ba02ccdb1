"""delta-rs and delta-spark write the same Delta tables from the same adversarial histories (issue #28).

One pipeline reads, from the test broker, the histories the other integration tests hold to their
oracles, each small:

==============================  =================================================================
sources                          what they carry
==============================  =================================================================
``s_*`` (three mirrors)         tests/adversarial_history.py: values at every type limit, NULLs,
                                 primary-key changes with tombstones, multi-row events, re-inserts,
                                 duplicates, a connector replay, malformed messages (dead letters);
                                 ``n_*`` (the same without the schema envelope) feed the graph of its
                                 views (joins, aggregates with MIN/MAX over the limits, Top-N with a
                                 NULL partition), not mirrored here
``orders``                       out-of-order and redelivered changes over two partitions, NULL keys
                                 (dead letters), a TRUNCATE applied (tests/integration/test_framed_batches.py)
``dbz_customers``                Postgres REPLICA IDENTITY DEFAULT: updates without before-images and
                                 unchanged TOASTed text as the placeholder (tests/keychange_history.py)
``shop`` (routed)                a routed database: a table created on first sight with ADD COLUMN, INT to
                                 BIGINT widening and DROP COLUMN under ``evolve``, two shards merged
``s_customers_history``          an SCD type 2 history table (delta-rs writes it whatever the engine)
==============================  =================================================================

It runs twice in this test process's Spark session (the delta JVM set is on its class path), over the
same topics, once with ``storage.engine: delta-rs`` and once with ``delta-spark``, each into a lake and
checkpoint of its own, in one micro-batch (the sink suite runs many-batch histories on both engines;
here every table's MERGE costs delta-spark Spark jobs). With delta-spark the mirrors with declared columns and the
graph tables stay on the executors (``DeltaSparkSink.apply_frame``: reduced and merged there), the routed
tables are collected and merged from an Arrow table (``apply``). Every table of the two lakes (tombstone
and dead-letter tables too) must hold the same schema and the same rows; the columns that record when
something was written (wall-clock times, and the ``_seq`` a graph table's collecting and executor paths
number differently, in the same order) are left out, and listed below.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from changelake.spark.delta_sink import DeltaSparkSink
from tests.adversarial_history import ENVELOPES, GRAPH, AdversarialShop, columns_of, encode, pipeline_yaml, truth
from tests.keychange_history import KeyChangeDatabase, pipeline_sections
from tests.keychange_history import encode as keychange_encode
from tests.plan.test_replica_identity import replica_identity_default
from tests.routed_history import RoutedDatabase
from tests.routed_history import produce as produce_routed

from .test_adversarial_history import _produce as produce_adversarial
from .test_framed_batches import _event as orders_event

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

#: columns whose values say when (wall clock) or in which numbering something was written, per table
#: name (a prefix of the table's path in the lake); the rest of every table must be equal
NOT_COMPARED = {
    "_changelake_tombstones": {"_deleted_at"},          # when the delete was merged
    "_dead_letters": {"received_at", "_dlq_at", "failed_at"},
    **{t: {"_seq"} for t in GRAPH},                     # the graph's changes are numbered per path
}

ROUTE = [{"source_table": r"shop\.orders_\d+", "table": "orders_all"},
         {"source_table": r"shop\.(.*)", "table": "shop_<>", "replace_symbol": "<>"}]


def _orders_events() -> list[tuple[int, str, int, dict | None]]:
    """(partition, op, binlog position, row): out of order across partitions, redelivered, NULL keys, a
    truncate at 5000 with changes from before it delivered after it."""
    events = [(i % 2, "c", 100 * i, {"id": i, "amount": i, "note": f"n{i} ä😀"}) for i in range(1, 21)]
    events += [(0, "c", 3050, {"id": None, "amount": 1, "note": "no key"}),
               (1, "u", 3100, {"id": 3, "amount": 33, "note": "newer"}),
               (0, "u", 2900, {"id": 3, "amount": -3, "note": "older, delivered later"}),
               (1, "d", 3200, {"id": 4, "amount": 4, "note": None}),
               (1, "c", 400, {"id": 4, "amount": 4, "note": "n4 ä😀"}),
               (0, "u", 3300, {"id": 5, "amount": 55, "note": "x"}),
               (0, "u", 3300, {"id": 5, "amount": 55, "note": "x"}),
               (0, "t", 5000, None),
               (1, "c", 4990, {"id": 98, "amount": 98, "note": "before the truncate"}),
               (0, "c", 6000, {"id": 100, "amount": 100, "note": "after"}),
               (1, "u", 6200, {"id": 100, "amount": 101, "note": "after, updated"})]
    return events


def _produce_everything(kafka, prefix: str, tmp_path: Path) -> tuple[dict, AdversarialShop, int]:
    """Every history to the broker; returns the config's raw sections (without pipeline/storage), the
    adversarial shop and the number of messages."""
    servers = kafka.bootstrap_servers
    shop = AdversarialShop(seed=5)
    events = shop.phase(snapshot={"customers": 8, "products": 8, "orders": 16}, changes=60)
    count = 0
    for p, schemas in ENVELOPES.items():
        messages = encode(events, prefix=f"{prefix}-{p}", schemas=schemas)
        produce_adversarial(servers, messages)
        count += len(messages)
    (tmp_path / "adversarial").mkdir()
    raw = yaml.safe_load(pipeline_yaml(prefix, servers, tmp_path / "adversarial", max_records=1).read_text())
    for source in raw["sources"]:           # the schema-less sources feed the graph only
        if source["name"].startswith("n_"):
            del source["table"]
    raw["tables"] = [t for t in raw["tables"] if not t["name"].startswith("n_") or t["name"] in GRAPH]

    orders = kafka.topic(f"{prefix}-orders", partitions=2)
    producer = Producer({"bootstrap.servers": servers, "log_level": 3})
    for partition, op, pos, row in _orders_events():
        key = None if row is None or row["id"] is None else orjson.dumps({"id": row["id"]})
        producer.produce(orders, key=key, value=orders_event(op, pos, row), partition=partition)
        count += 1
    producer.flush(30)
    raw["sources"].append({"name": "orders", "topics": [orders], "columns": {"id": "bigint", "amount": "bigint",
                                                                              "note": "string"},
                           "table": "orders", "on_truncate": "apply", "on_error": "dlq"})
    raw["tables"].append({"name": "orders", "primary_key": ["id"]})

    db = KeyChangeDatabase(seed=7).history(customers=6, orders=10, changes=50)
    messages, unsent = replica_identity_default(keychange_encode(db, "debezium-json", topic_prefix=f"{prefix}-ri-dbz",
                                                                 redeliver=5))
    assert unsent >= 1, "the history should leave TOASTed values out"
    producer = Producer({"bootstrap.servers": servers, "log_level": 3})
    for m in messages:
        producer.produce(m.topic, key=m.key, value=m.value, partition=0)
    producer.flush(30)
    count += len(messages)
    sections = pipeline_sections(f"{prefix}-ri", ["debezium-json"], views=False)
    for s in sections["sources"]:
        s["options"] = {"upsert": True}
    raw["sources"] += [s for s in sections["sources"] if s["table"] == "dbz_customers"]
    raw["tables"] += [t for t in sections["tables"] if t["name"] == "dbz_customers"]

    routed_prefix = f"{prefix}_routed".replace("-", "_")
    routed = RoutedDatabase(prefix=routed_prefix, seed=9)
    tables = {"t1": (1, 1), "orders_0": (0, 2), "orders_1": (1, 2)}
    messages = routed.history(tables, changes=30, redeliver=0)
    messages += routed.more(50, redeliver=6, earlier=messages, ddl=0.25, alterable=("t1",))
    assert routed.ddl_log, "the routed history should alter a table"
    produce_routed(messages, servers)
    count += len(messages)
    raw["sources"].append({"name": "shop", "topic_pattern": rf"{routed_prefix}\.shop\..*", "format": "debezium-json",
                           "schema_change": "evolve", "route": ROUTE})

    raw["tables"].append({"name": "s_customers_history", "from": "s_customers", "primary_key": ["id"],
                          "history": "scd2"})
    return raw, shop, count


def _config(raw: dict, workdir: Path, engine: str, max_records: int):
    # no VACUUM (due at a sink's first batch): ~60 Spark jobs per table and tombstone table with delta-spark
    tables = [{**t, "maintenance": {"vacuum_every": None}} for t in raw["tables"]]
    sources = [{**s, "route": [{**r, "maintenance": {"vacuum_every": None}} for r in s["route"]]} if "route" in s
               else s for s in raw["sources"]]
    raw = {**raw, "tables": tables, "sources": sources,
           "pipeline": {**raw["pipeline"], "checkpoint": str(workdir / "ckpt"),
                               "max_records_per_batch": max_records},
           "storage": {"root": str(workdir / "lake"), "engine": engine}}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return parse_config(path.read_text(), origin=str(path))


def _run(spark, config) -> BatchProcessor:
    processor = BatchProcessor(config, spark=spark)
    start_query(spark, config, processor, available_now=True).awaitTermination()
    return processor


def _lake(root: Path) -> dict[str, tuple[str, list]]:
    """Every Delta table under ``root`` (by its path there): its schema, and its rows without the columns
    of :data:`NOT_COMPARED`, sorted."""
    out = {}
    for log in sorted(root.rglob("_delta_log")):
        name = str(log.parent.relative_to(root))
        skip = set().union(*(cols for prefix, cols in NOT_COMPARED.items() if name.split("/")[0] == prefix
                             or name == prefix))
        schema = DeltaTable(str(log.parent)).schema().to_arrow()
        rows = read_delta(str(log.parent)).to_pylist()
        out[name] = (str(schema), sorted(repr(sorted((k, v) for k, v in r.items() if k not in skip)) for r in rows))
    return out


def test_every_adversarial_history_gives_the_same_delta_tables_on_delta_rs_and_delta_spark(spark, kafka, tmp_path):
    prefix = kafka.topic("cross")
    raw, shop, count = _produce_everything(kafka, prefix, tmp_path)
    max_records = count + 1                      # one micro-batch
    rs = _config(raw, tmp_path / "rs", "delta-rs", max_records)
    ds = _config(raw, tmp_path / "ds", "delta-spark", max_records)

    on_rs = _run(spark, rs)
    on_ds = _run(spark, ds)

    # the engines did what they are meant to: delta-spark merged the framed tables on the executors
    assert on_ds.totals.batch_id == on_rs.totals.batch_id == 0
    framed = set(on_ds.framed_tables())
    assert {"s_customers", "s_orders", "orders", "dbz_customers", *GRAPH} <= framed, framed
    assert isinstance(on_ds._sink("shop_t1"), DeltaSparkSink)
    assert not on_rs.framed_tables()
    ds_lake, rs_lake = tmp_path / "ds" / "lake", tmp_path / "rs" / "lake"     # routed tables have no tables[] entry
    engines = {_engine_of(str(ds_lake / t)) for t in (*framed, "shop_t1", "orders_all")}
    assert engines == {"Apache-Spark"}, engines
    assert _engine_of(str(ds_lake / "s_customers_history")) == "delta-rs"
    assert {_engine_of(str(rs_lake / t)) for t in (*framed, "shop_t1")} == {"delta-rs"}

    # ... and wrote the same tables, which equal the source (mirrors) and DuckDB over it (graph)
    want = {name: rows for name, rows in truth(shop).items() if not name.startswith("n_") or name in GRAPH}
    for name, rows in want.items():
        got = {tuple(r.values()) for r in read_delta(ds.table_path(name), columns=columns_of(name)).to_pylist()}
        assert got == rows, name
    left, right = _lake(rs_lake), _lake(ds_lake)
    assert sorted(left) == sorted(right)
    every = {*want, "orders", "dbz_customers", "orders_all", "shop_t1",
             "s_customers_history", "_dead_letters"}
    assert {name for name in every if not left.get(name, (None, []))[1]} == set(), sorted(left)
    differ = {name: (len(left[name][1]), len(right[name][1])) for name in left if left[name] != right[name]}
    assert differ == {}, {n: (left[n][0], right[n][0]) if left[n][0] != right[n][0] else
                          sorted(set(left[n][1]) ^ set(right[n][1]))[:4] for n in differ}


def _engine_of(path: str) -> str:
    """Which writer made the table's last data commit (``engineInfo`` of delta-spark, ``clientVersion``
    of delta-rs), read from the log."""
    for commit in DeltaTable(path).history(5):
        if commit.get("operation") in ("MERGE", "WRITE", "CREATE TABLE", "DELETE"):
            info = str(commit.get("engineInfo") or commit.get("clientVersion") or "")
            return "Apache-Spark" if info.startswith("Apache-Spark") else "delta-rs" if "delta-rs" in info else info
    return "none"
