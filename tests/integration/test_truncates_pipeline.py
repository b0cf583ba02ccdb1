"""Truncates end to end: Debezium MySQL changes on four partitions of the test broker, through
``changelake run --available-now`` (Spark, several micro-batches), into a real Delta table.

The table's TRUNCATE (op ``t``, at binlog position 5000, on partition 0) empties the mirror at
that position: rows written before it go, changes from before it that other partitions deliver
later (in the same run or the next) stay out, changes after it apply. A second source on the same
topic with ``on_truncate: skip`` keeps every row and counts the truncate.
"""

from __future__ import annotations

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta

from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _event(op: str, pos: int, row: dict | None = None) -> bytes:
    source = {"connector": "mysql", "db": "shop", "table": "orders", "file": "mysql-bin.000007", "pos": pos,
              "row": 0, "ts_ms": 1_700_000_000_000}
    before = row if op == "d" else {**row, "amount": 0} if op == "u" else None
    return orjson.dumps({"op": op, "before": before, "after": None if op in ("d", "t") else row,
                         "source": source, "ts_ms": 1_700_000_000_000})


def _produce(servers: str, topic: str, events: list[tuple[int, str, int, dict | None]]) -> None:
    """``(partition, op, binlog position, row)`` events, in this order per partition."""
    producer = Producer({"bootstrap.servers": servers, "log_level": 3})
    for partition, op, pos, row in events:
        key = None if row is None else orjson.dumps({"id": row["id"]})
        producer.produce(topic, key=key, value=_event(op, pos, row), partition=partition)
    producer.flush(30)


def _rows(path: str) -> dict[int, int]:
    return {r["id"]: r["amount"] for r in read_delta(path, columns=["id", "amount"]).to_pylist()}


def test_truncate_empties_the_mirror_at_its_position_across_partitions_and_runs(kafka, tmp_path):
    topic = kafka.topic("trunc", partitions=4)
    columns = {"id": "bigint", "amount": "bigint"}
    config = {
        "pipeline": {"id": f"it-{topic}", "checkpoint": str(tmp_path / "ckpt"), "max_records_per_batch": 15,
                     "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "storage": {"root": str(tmp_path / "lake")},
        "metrics": {"port": 0},
        "sources": [{"name": "orders", "topics": [topic], "columns": columns, "table": "orders",
                     "on_truncate": "apply"},
                    {"name": "orders_all", "topics": [topic], "columns": columns, "table": "orders_all"}],
        "tables": [{"name": "orders", "primary_key": ["id"]}, {"name": "orders_all", "primary_key": ["id"]}],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))

    before = [(i % 4, "c", 100 * i, {"id": i, "amount": i}) for i in range(1, 41)]           # positions < 5000
    after = [(2 + i % 2, "c", 6000 + 10 * i, {"id": 100 + i, "amount": i}) for i in range(10)]
    late = [(1, "u", 4900, {"id": 5, "amount": -5}), (3, "c", 4950, {"id": 99, "amount": 99})]
    _produce(kafka.bootstrap_servers, topic, before + [(0, "t", 5000, None)] + late + after)
    first = _run_pipeline(path)
    assert first.returncode == 0, first.stderr[-3000:]
    want = {100 + i: i for i in range(10)}
    assert _rows(str(tmp_path / "lake" / "orders")) == want
    everything = {i: i for i in range(1, 41)} | {5: -5, 99: 99} | want
    assert _rows(str(tmp_path / "lake" / "orders_all")) == everything

    # the next run: a change from before the truncate stays out, a delete and an insert after it apply
    _produce(kafka.bootstrap_servers, topic, [(2, "c", 4990, {"id": 98, "amount": 98}),
                                              (3, "d", 7000, {"id": 101, "amount": 1}),
                                              (1, "c", 7100, {"id": 200, "amount": 200})])
    second = _run_pipeline(path)
    assert second.returncode == 0, second.stderr[-3000:]
    want = {k: v for k, v in want.items() if k != 101} | {200: 200}
    assert _rows(str(tmp_path / "lake" / "orders")) == want
