"""Transaction-consistent commits end to end: a generated history of multi-table transactions (Debezium MySQL
events on three topics of four partitions, BEGIN/END on the transaction metadata topic) on the test broker,
through ``changelake run --available-now`` (Spark, small micro-batches), killed (SIGKILL) between two
tables' commits and restarted.

Every row the progress table ``_changelake_consistency`` holds names a cut; each table read at that row's
version (time travel) must be the database's state after the row's ``transactions``-th transaction. (That the
default ``consistency: offset`` shows states the database never had is tests/service/test_transaction_consistency.py's,
on the same histories without a JVM.)
"""

from __future__ import annotations

import signal

import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from tests import txn_history as th

from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _setup(kafka, tmp_path, consistency: str = "transaction") -> tuple[th.History, object, str]:
    prefix = kafka.topic("txn")
    names = th.topics(prefix)
    kafka.create_topics({**{t: th.PARTITIONS for t in names.values()}, f"{prefix}.transaction": 1})
    history = th.generate(11, transactions=40, prefix=prefix)
    th.produce(history, kafka.bootstrap_servers)
    config = {
        "pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "ckpt"), "max_records_per_batch": 25,
                     "consistency_table": True, "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "storage": {"root": str(tmp_path / "lake")},
        "metrics": {"port": 0},
        "sources": [{"name": t, "topics": [names[t]], "table": t, "consistency": consistency,
                     "columns": {c: "bigint" for c in cols}} for t, cols in th.TABLES.items()],
        "tables": [{"name": t, "primary_key": ["id"]} for t in th.TABLES],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return history, tmp_path / "lake", str(path)


def _cuts(lake) -> list[tuple[dict, dict]]:
    """Every row of the progress table with the tables read at its versions."""
    out = []
    for row in sorted(read_delta(str(lake / "_changelake_consistency")).to_pylist(), key=lambda r: r["batch_id"]):
        tables = {}
        for name, version in row["tables"]:
            rows = read_delta(str(lake / name), version=version, columns=th.TABLES[name]).to_pylist()
            if rows:
                tables[name] = {r["id"]: r for r in rows}
        out.append((row, tables))
    return out


def test_every_cut_is_a_state_the_database_had_across_a_sigkill(kafka, tmp_path):
    history, lake, path = _setup(kafka, tmp_path)
    crashed = _run_pipeline(path, fault="after-first-table@2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    cuts = _cuts(lake)
    assert len(cuts) >= 5
    assert [r["batch_id"] for r, _ in cuts] == list(range(len(cuts)))      # one row per batch, none twice
    assert any(r["held_rows"] for r, _ in cuts), "the batches should have cut through transactions"
    for row, tables in cuts:
        expected = {t: rows for t, rows in history.states[row["transactions"]].items() if rows}
        assert tables == expected, f"batch {row['batch_id']}"
    assert cuts[-1][0]["transactions"] == len(history.states) - 1
    assert cuts[-1][1] == history.states[-1]
