"""Live schema changes of Debezium JSON with schema, through `changelake run` (Spark, Kafka, Delta).

``orders`` (lenient) gets a new Connect schema mid-stream that adds a column and widens
``qty`` from int32 to int64 (with values beyond 2^31): the batch that brings it writes it,
no restart. ``items`` (lenient) gets one that changes ``name`` from string to int64, which
lenient refuses: ``items`` is quarantined (its messages from then on are dead letters)
while ``orders`` goes on. The fix (``items`` set to try_evolve: the column keeps its type,
the numbers are written as text), a restart and ``changelake dlq replay`` bring every
quarantined change into ``items``.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]


def field(name: str, kind: str, optional: bool = True) -> dict:
    return {"type": kind, "field": name, "optional": optional}


def change(fields: list[dict], after: dict, pos: int) -> bytes:
    """A Debezium JSON insert in the JSON converter's {schema, payload} envelope (MySQL at binlog ``pos``)."""
    row = {"type": "struct", "fields": fields, "optional": True, "name": "shop.Value"}
    schema = {"type": "struct", "optional": False, "name": "shop.Envelope", "fields": [
        dict(row, field="before"), dict(row, field="after"), field("op", "string", False),
        {"type": "struct", "field": "source", "optional": False, "fields": [
            field("file", "string"), field("pos", "int64")]}]}
    payload = {"before": None, "after": after, "op": "c", "source": {"file": "mysql-bin.000001", "pos": pos}}
    return orjson.dumps({"schema": schema, "payload": payload})


ORDERS_V1 = [field("id", "int32", False), field("qty", "int32")]
ORDERS_V2 = [field("id", "int32", False), field("qty", "int64"), field("email", "string")]
ITEMS_V1 = [field("id", "int32", False), field("name", "string")]
ITEMS_V2 = [field("id", "int32", False), field("name", "int64")]


def _produce(servers: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    p = Producer({"bootstrap.servers": servers, "log_level": 3})
    for key, value in values:
        p.produce(topic, key=b'{"id": %d}' % key, value=value, partition=0)
    p.flush(30)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "INFO", *args],
                          capture_output=True, text=True, timeout=600)


def test_columns_added_and_widened_live_while_a_refused_change_quarantines_one_table_then_replay(kafka, tmp_path):
    prefix = kafka.topic("evolve")
    raw = {
        "pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "ckpt"), "max_records_per_batch": 8},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "sources": [
            {"name": "orders", "topics": [f"{prefix}.orders"], "table": "orders",
             "options": {"schema-include": True}},
            {"name": "items", "topics": [f"{prefix}.items"], "table": "items", "options": {"schema-include": True}}],
        "tables": [{"name": "orders", "primary_key": ["id"]}, {"name": "items", "primary_key": ["id"]}],
        "storage": {"root": str(tmp_path / "lake")},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = parse_config(path.read_text())
    _produce(kafka.bootstrap_servers, f"{prefix}.orders",
             [(i, change(ORDERS_V1, {"id": i, "qty": i}, i)) for i in range(1, 11)]
             + [(i, change(ORDERS_V2, {"id": i, "qty": 2**40 + i, "email": f"o{i}@x"}, i)) for i in range(11, 21)])
    _produce(kafka.bootstrap_servers, f"{prefix}.items",
             [(i, change(ITEMS_V1, {"id": i, "name": f"n{i}"}, i)) for i in range(1, 11)]
             + [(i, change(ITEMS_V2, {"id": i, "name": 1000 + i}, i)) for i in range(11, 16)]
             + [(i, change(ITEMS_V1, {"id": i, "name": f"n{i}"}, i)) for i in range(16, 19)])

    run = _cli("run", "--available-now", "-c", str(path))
    assert run.returncode == 0, run.stderr[-3000:]

    orders = read_delta(config.table_path("orders")).sort_by("id")
    assert orders.schema.field("qty").type == pa.int64()
    assert orders["id"].to_pylist() == list(range(1, 21))
    assert orders["qty"].to_pylist() == list(range(1, 11)) + [2**40 + i for i in range(11, 21)]
    assert orders["email"].to_pylist() == [None] * 10 + [f"o{i}@x" for i in range(11, 21)]
    assert "table orders: schema change widen_type: qty int32 -> qty int64" in run.stderr
    assert "table orders: schema change add_column: - -> email string" in run.stderr

    items = read_delta(config.table_path("items"))
    landed = set(items["id"].to_pylist())
    letters = read_delta(config.dead_letter_path())
    quarantined = {orjson.loads(v)["payload"]["after"]["id"] for v in letters["value"].to_pylist()}
    assert set(letters["reason"].to_pylist()) == {"schema-incompatible"}
    assert "column 'name' changed from string to int64" in letters["error"][0].as_py()
    assert landed | quarantined == set(range(1, 19)) and not landed & quarantined     # none lost, none twice
    assert set(range(11, 19)) <= quarantined                                         # old schema after it too
    assert run.stderr.count("table items is quarantined") == 1

    # the fix: items keeps its string column and takes the numbers as text; restart, replay
    raw["tables"][1]["schema_change"] = "try_evolve"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    other = _cli("dlq", "replay", "--table", "orders", "--dry-run", "-c", str(path))   # orders lost nothing
    assert other.returncode == 0 and "would replay 0 dead letter(s)" in other.stdout, other.stderr[-3000:]
    replay = _cli("dlq", "replay", "--table", "items", "-c", str(path))
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert f"replayed {len(quarantined)} dead letter(s)" in replay.stdout
    rerun = _cli("run", "--available-now", "-c", str(path))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    items = read_delta(config.table_path("items")).sort_by("id")
    assert items["id"].to_pylist() == list(range(1, 19))
    assert items["name"].to_pylist() == [f"n{i}" for i in range(1, 11)] + [str(1000 + i) for i in range(11, 16)] \
        + [f"n{i}" for i in range(16, 19)]
    assert items.schema.field("name").type == pa.string()
    assert "quarantined" not in rerun.stderr
