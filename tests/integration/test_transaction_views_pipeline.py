"""Views (a join, aggregates, a Top-N) under ``consistency: transaction`` end to end: a generated history of
multi-table transactions (Debezium MySQL events on three topics of four partitions, BEGIN/END on the
transaction metadata topic) on the test broker, through ``changelake run --available-now`` (Spark, small
micro-batches).

While the pipeline runs, a reader repeatedly takes the consistent snapshot (the progress table's newest row,
every table at its version) and checks invariants the source keeps in every transaction (the balances add
up to the same total, each customer's quantity is the sum of their order lines, the Top-3 are the richest
accounts); afterwards every row of the progress table is checked the same way, and, with ``transaction``,
against the database's state after that row's ``transactions``-th transaction. With the default
(``consistency: offset``, the views on the executors) the same checks find violations: they can fail. With
``transaction`` the run is killed (SIGKILL) between two tables' commits and restarted: no transaction
applied twice or half, one progress row per batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from tests import txn_history as th
from tests.service.test_transaction_views import VIEW_TABLES, config_of, views_of, violations

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

#: how many source transactions the history has; a long run for many more snapshots (docs/benchmarks.md):
#: CHANGELAKE_TEST_TXN_TRANSACTIONS=1500 pytest tests/integration/test_transaction_views_pipeline.py -k sigkill -s
TRANSACTIONS = int(os.environ.get("CHANGELAKE_TEST_TXN_TRANSACTIONS", "40"))


def _setup(kafka, tmp_path, consistency: str) -> tuple[th.History, str, str]:
    prefix = kafka.topic("txnv")
    names = th.topics(prefix)
    kafka.create_topics({**{t: th.PARTITIONS for t in names.values()}, f"{prefix}.transaction": 1})
    history = th.generate(17, transactions=TRANSACTIONS, prefix=prefix)
    th.produce(history, kafka.bootstrap_servers)
    lake = str(tmp_path / "lake")
    config = config_of(lake, str(tmp_path / "ckpt"), consistency=consistency, topics=names,
                       max_records_per_batch=25, spark_conf={"spark.sql.shuffle.partitions": "2"})
    config["pipeline"]["id"] = f"it-{prefix}"
    config["kafka"]["bootstrap_servers"] = kafka.bootstrap_servers
    config["metrics"] = {"port": 0}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return history, lake, str(path)


def _snapshot(lake: str, row: dict) -> dict[str, dict]:
    tables = {}
    for name, version in row["tables"]:
        key, cols = VIEW_TABLES.get(name, ("id", th.TABLES.get(name)))
        tables[name] = {r[key]: r for r in read_delta(f"{lake}/{name}", version=version, columns=cols).to_pylist()}
    return tables


def _progress(lake: str) -> list[dict]:
    try:
        return sorted(read_delta(f"{lake}/_changelake_consistency").to_pylist(), key=lambda r: r["batch_id"])
    except Exception:           # not written yet
        return []


def _run_reading(path: str, lake: str, *, fault: str | None = None) -> tuple[subprocess.CompletedProcess, int, list]:
    """Run the pipeline; while it runs, take the newest consistent snapshot over and over and check it."""
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    if fault:
        env["CHANGELAKE_FAULT"] = fault
    proc = subprocess.Popen([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING", "run",
                             "--available-now", "-c", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    reads, found = 0, []
    deadline = time.monotonic() + 600 + 2 * TRANSACTIONS
    while proc.poll() is None and time.monotonic() < deadline:
        rows = _progress(lake)
        if rows:
            found += [f"batch {rows[-1]['batch_id']}: {v}" for v in violations(_snapshot(lake, rows[-1]))]
            reads += 1
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), reads, found


def test_views_show_only_states_after_whole_transactions_across_a_sigkill(kafka, tmp_path):
    history, lake, path = _setup(kafka, tmp_path, "transaction")
    crashed, reads, found = _run_reading(path, lake, fault="after-first-table@3")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    restarted, more, found_after = _run_reading(path, lake)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert found + found_after == []
    rows = _progress(lake)
    assert [r["batch_id"] for r in rows] == list(range(len(rows)))      # one row per batch, none twice
    assert any(r["held_rows"] for r in rows), "the batches should have cut through transactions"
    for row in rows:
        tables = _snapshot(lake, row)
        state = history.states[row["transactions"]]
        expected = {**state, **views_of(state)}
        assert {t: v for t, v in tables.items() if v} == {t: v for t, v in expected.items() if v}, row["batch_id"]
    assert rows[-1]["transactions"] == len(history.states) - 1
    assert set(dict(rows[-1]["tables"])) >= set(VIEW_TABLES)
    print(f"{reads + more} snapshots read while running, {len(rows)} progress rows checked")


def test_the_default_shows_views_of_half_transactions(kafka, tmp_path):
    history, lake, path = _setup(kafka, tmp_path, "offset")
    done, reads, found = _run_reading(path, lake)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _progress(lake)
    found += [f"batch {r['batch_id']}: {v}" for r in rows for v in violations(_snapshot(lake, r))]
    assert len(found) >= 3, found
    final = _snapshot(lake, rows[-1])
    assert {t: v for t, v in final.items() if v} == \
        {t: v for t, v in {**history.states[-1], **views_of(history.states[-1])}.items() if v}    # the end is right
