"""Postgres without REPLICA IDENTITY FULL on Spark: the key-change history as Debezium's Postgres
connector writes it for REPLICA IDENTITY DEFAULT (updates without ``before``, deletes with only the
key, primary-key updates as delete + create, unchanged TOASTed text as ``__debezium_unavailable_value``)
goes through the test broker and ``changelake run --available-now`` (two micro-batches) into the
mirrors and ``orders LEFT JOIN customers`` -> sales by region (the TOASTed column) -> top 2. Every
table equals the final state / DuckDB over it: the before-images and the unsent values come from the
source's normalize state on the executors, and no table holds the placeholder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.service.config import load_config
from tests.keychange_history import (
    GRAPH_TABLES,
    TABLES,
    KeyChangeDatabase,
    encode,
    expected_graph_tables,
    pipeline_sections,
)
from tests.plan.test_replica_identity import replica_identity_default

from .test_crash_recovery import _run_pipeline
from .test_key_changes import _produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _read(config, name: str, columns: list[str]) -> set[tuple]:
    path = config.table_path(name)
    if not (Path(path) / "_delta_log").exists():
        return set()
    return {tuple(r[c] for c in columns) for r in read_delta(path, columns=columns).to_pylist()}


def test_replica_identity_default_history_retracts_from_state_on_spark(kafka, tmp_path):
    prefix = kafka.topic("ri")
    db = KeyChangeDatabase(seed=31).history(customers=10, orders=14, changes=120)
    messages, unsent = replica_identity_default(encode(db, "debezium-json", topic_prefix=f"{prefix}-dbz",
                                                       redeliver=8))
    assert unsent >= 3
    _produce(kafka.bootstrap_servers, messages)
    sections = pipeline_sections(prefix, ["debezium-json"])
    for s in sections["sources"]:
        s["options"] = {"upsert": True}
    raw = {"pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "checkpoints"),
                        "max_records_per_batch": len(messages) // 2 + 1,
                        "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}},
           "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
           "storage": {"root": str(tmp_path / "lake")}, "metrics": {"port": 0}, **sections}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(path)

    run = _run_pipeline(path)
    assert run.returncode == 0, run.stderr[-3000:]
    want = {f"dbz_{t}": {tuple(r[c] for c in spec["columns"]) for r in db.state[t].values()}
            for t, spec in TABLES.items()}
    want |= {f"dbz_{t}": rows for t, rows in expected_graph_tables(db).items()}
    got = {f"dbz_{t}": _read(config, f"dbz_{t}", list(spec["columns"])) for t, spec in TABLES.items()}
    got |= {f"dbz_{t}": _read(config, f"dbz_{t}", cols) for t, (_, cols, _) in GRAPH_TABLES.items()}
    assert {t for t in want if got[t] != want[t]} == set()
