"""A mirrored table stores its source's columns in their declared order (docs/formats.md, "Output
columns"), the demo's tables included; a later column goes at the end. Without Spark: the decode
stage and the processor run in-process, as the executors and the driver would."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

import changelake.service.inventory as inv
from changelake.service.config import parse_config
from changelake.service.demo import demo_config, write_demo_config
from changelake.service.pipeline import BatchProcessor
from changelake.spark.kafka_source import ARROW_SCHEMA

pytestmark = pytest.mark.unit


def _records(messages: list[inv.Message], first_offset: int = 0) -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_pydict({
        "topic": [m.topic for m in messages], "partition": [0] * n,
        "offset": list(range(first_offset, first_offset + n)), "timestamp": [0] * n,
        "key": [m.key for m in messages], "value": [m.value for m in messages], "expired": [0] * n,
    }, schema=ARROW_SCHEMA)


def _run_batch(processor: BatchProcessor, messages: list[inv.Message], batch_id: int, first_offset: int = 0) -> None:
    processor.stage.begin({})
    out = pa.Table.from_batches(list(processor.stage(iter([_records(messages, first_offset)]))))
    processor.process_decoded(out, batch_id)


def test_the_demo_tables_keep_the_declared_column_order(tmp_path: Path):
    raw = demo_config(bootstrap_servers="127.0.0.1:9", workdir=tmp_path, metrics_port=0, views=False)
    config = write_demo_config(raw, tmp_path / "pipeline.yaml")
    db = inv.InventoryDatabase(seed=3)
    messages = [m for m in db.history(snapshot_sizes={"customers": 5, "products": 5, "orders": 5}, changes=20,
                                      redeliver=0) if m.value is not None]
    _run_batch(BatchProcessor(config, graph=None), messages, 0)
    for table, spec in inv.TABLES.items():
        stored = DeltaTable(config.table_path(table)).schema().to_arrow().names
        assert stored == [*spec["columns"], "_seq", "_source_ts"], table
    assert list(yaml.safe_load((tmp_path / "pipeline.yaml").read_text())["sources"][0]["columns"]) == \
        list(inv.TABLES["customers"]["columns"])


def _customer(op: str, row: dict, pos: int) -> inv.Message:
    import orjson
    value = {"before": None if op == "c" else row, "after": row, "op": op, "ts_ms": 1_700_000_000_000 + pos,
             "source": {"connector": "mysql", "db": "inventory", "table": "customers", "file": "mysql-bin.000001",
                        "pos": pos, "row": 0, "ts_ms": 1_700_000_000_000 + pos}}
    return inv.Message("shop.customers", orjson.dumps({"id": row["id"]}), orjson.dumps(value))


def test_columns_learnt_from_the_messages_keep_their_order_and_new_ones_go_last(tmp_path: Path):
    text = yaml.safe_dump({
        "pipeline": {"id": "order", "checkpoint": str(tmp_path / "ck")},
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "sources": [{"name": "customers", "topics": ["shop.customers"], "format": "debezium-json",
                     "table": "customers"}],
        "tables": [{"name": "customers", "primary_key": ["id"]}],
        "storage": {"root": str(tmp_path / "lake")},
    }, sort_keys=False)
    config = parse_config(text)
    processor = BatchProcessor(config, graph=None)
    _run_batch(processor, [_customer("c", {"zip": "1000", "id": 1, "name": "a"}, 10)], 0)
    path = config.table_path("customers")
    assert DeltaTable(path).schema().to_arrow().names == ["zip", "id", "name", "_seq", "_source_ts"]
    _run_batch(processor, [_customer("c", {"zip": "2000", "id": 2, "name": "b", "age": 3}, 20)], 1, first_offset=1)
    assert DeltaTable(path).schema().to_arrow().names == ["zip", "id", "name", "_seq", "_source_ts", "age"]
