"""Issue #16 end to end: updates that change primary keys, in every format, through mirrors and the
graph on Spark, exactly once across a SIGKILL.

The key-change history of ``tests/keychange_history.py`` (fresh keys, back and forth, chains, a key
moved onto a just-deleted key, chains inside multi-row Canal messages, re-deliveries) goes to the
test broker as Canal, Maxwell, OGG and Debezium JSON, each table's messages in one partition
(Canal's and Maxwell's default; see docs/formats.md "Key changes" for partitioned topics). The
service (``changelake run --available-now`` in a child process) mirrors both tables of every format
(keys from the source, the table, or learnt from the message keys) and runs, per format,
``orders LEFT JOIN customers`` -> rows with a customer -> sales by region -> top 2. The first run is
killed with SIGKILL in the middle of batch 1 (of two); after the restart every table must equal the
database's final state (mirrors) and DuckDB over it (graph tables).

Kept to two micro-batches: the four graphs make 24 stateful operators, whose fixed cost per batch
dominates (a further restart that finds nothing to do is tested by test_graph_pipeline.py).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from tests.keychange_history import (
    FORMATS,
    GRAPH_TABLES,
    PREFIX,
    TABLES,
    KeyChangeDatabase,
    encode,
    expected_graph_tables,
    pipeline_sections,
)

from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _produce(servers: str, messages) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "enable.idempotence": True,
                         "log_level": 3})
    for m in messages:
        producer.produce(m.topic, key=m.key, value=m.value, partition=0)
    assert producer.flush(60) == 0


def _tables(config) -> dict[str, set[tuple]]:
    out = {}
    for fmt in FORMATS:
        p = PREFIX[fmt]
        for table, spec in TABLES.items():
            out[f"{p}_{table}"] = _read(config, f"{p}_{table}", list(spec["columns"]))
        for table, (_, columns, _) in GRAPH_TABLES.items():
            out[f"{p}_{table}"] = _read(config, f"{p}_{table}", columns)
    return out


def _read(config, name: str, columns: list[str]) -> set[tuple]:
    path = config.table_path(name)
    if not (Path(path) / "_delta_log").exists():      # not created yet
        return set()
    return {tuple(r[c] for c in columns) for r in read_delta(path, columns=columns).to_pylist()}


def test_key_changes_in_every_format_sigkill_then_restart(kafka, tmp_path):
    from changelake.service.config import load_config

    prefix = kafka.topic("keys")
    db = KeyChangeDatabase(seed=29).history(customers=10, orders=14, changes=80)
    assert set(db.key_changes) == {"fresh", "back", "chain", "chain-in-statement", "onto-deleted"}
    messages = [m for fmt in FORMATS for m in encode(db, fmt, topic_prefix=f"{prefix}-{PREFIX[fmt]}", redeliver=8)]
    _produce(kafka.bootstrap_servers, messages)
    raw = {"pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "checkpoints"),
                        "trigger_interval": "2 seconds", "max_records_per_batch": len(messages) // 2 + 1,
                        "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}},
           "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
           "storage": {"root": str(tmp_path / "lake")}, "metrics": {"port": 0},
           **pipeline_sections(prefix)}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(path)

    graph = expected_graph_tables(db)
    want = {}
    for fmt in FORMATS:
        p = PREFIX[fmt]
        want |= {f"{p}_{t}": {tuple(r[c] for c in spec["columns"]) for r in db.state[t].values()}
                 for t, spec in TABLES.items()}
        want |= {f"{p}_{t}": rows for t, rows in graph.items()}
    assert any(r[3] is None for r in graph["orders_enriched"]), "some order should join a moved-away customer"

    crashed = _run_pipeline(path, fault="after-first-table@1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert _tables(config) != want, "the crash should leave tables behind the source"

    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    got = _tables(config)
    assert {t for t in want if got[t] != want[t]} == set()
