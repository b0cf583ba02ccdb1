"""Views behind the transaction gate (``consistency: transaction`` with a join, aggregates and a Top-N), in
process: decode stage -> driver gate -> the views on the driver -> delta-rs sinks -> ``_changelake_consistency``
(no JVM, no broker).

Generated histories of multi-table transactions (tests/txn_history.py: transfers between accounts, orders
inserted and cancelled with their lines) cut into micro-batches at random offsets. After every batch a reader
takes the consistent snapshot (every table, mirrors and views, at the versions of the progress table's newest
row) and checks that each view is the view of the source database's state after the row's ``transactions``-th
transaction: the balance total stays :data:`~tests.txn_history.TOTAL`, each customer's quantity is the sum of
their order lines, the Top-3 accounts are the richest three. (The default, ``consistency: offset``, shows the
same views breaking these: tests/integration/test_transaction_views_pipeline.py, where the views run on the
executors.) A crash between two tables' commits and a new process: the views' state comes back from the
checkpoint with the held rows, and no transaction is applied twice or half.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from tests import txn_history as th

pytestmark = pytest.mark.unit

VIEWS = [
    {"name": "balance_total",
     "sql": "SELECT id % 2 AS parity, SUM(balance) AS total, COUNT(*) AS n FROM accounts GROUP BY id % 2"},
    {"name": "customer_qty",
     "sql": "SELECT o.customer, SUM(l.qty) AS qty, COUNT(*) AS lines FROM order_lines l "
            "JOIN orders o ON l.order_id = o.id GROUP BY o.customer"},
    {"name": "top_accounts",
     "sql": "SELECT id, balance, rn FROM (SELECT id, balance, ROW_NUMBER() OVER (ORDER BY balance DESC, id) AS rn "
            "FROM accounts) WHERE rn <= 3"},
]
#: view -> (its key, its columns)
VIEW_TABLES = {"balance_total": ("parity", ["parity", "total", "n"]),
               "customer_qty": ("customer", ["customer", "qty", "lines"]),
               "top_accounts": ("rn", ["rn", "id", "balance"])}


def config_of(lake: str, checkpoint: str, *, consistency: str = "transaction", topics: dict | None = None,
              **pipeline) -> dict:
    topics = topics or th.TOPICS
    return {
        "pipeline": {"id": "txn-views", "checkpoint": checkpoint, "consistency_table": True, **pipeline},
        "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": lake},
        "sources": [{"name": t, "topics": [topics[t]], "format": "debezium-json", "table": t,
                     "columns": {c: "bigint" for c in cols}, "consistency": consistency}
                    for t, cols in th.TABLES.items()],
        "views": VIEWS,
        "tables": [{"name": t, "primary_key": ["id"]} for t in th.TABLES]
                  + [{"name": v, "from": v, "primary_key": [key]} for v, (key, _) in VIEW_TABLES.items()]}


def views_of(db: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """The views over one state of the source database (what each view table must hold)."""
    totals: dict[int, dict] = {}
    for r in db["accounts"].values():
        t = totals.setdefault(r["id"] % 2, {"parity": r["id"] % 2, "total": 0, "n": 0})
        t["total"] += r["balance"]
        t["n"] += 1
    qty: dict[int, dict] = {}
    for line in db["order_lines"].values():
        order = db["orders"].get(line["order_id"])
        if order is not None:
            q = qty.setdefault(order["customer"], {"customer": order["customer"], "qty": 0, "lines": 0})
            q["qty"] += line["qty"]
            q["lines"] += 1
    ranked = sorted(db["accounts"].values(), key=lambda r: (-r["balance"], r["id"]))[:3]
    top = {i + 1: {"rn": i + 1, "id": r["id"], "balance": r["balance"]} for i, r in enumerate(ranked)}
    return {"balance_total": totals, "customer_qty": qty, "top_accounts": top}


def snapshot(lake: str) -> tuple[dict, dict[str, dict]]:
    """The consistent read: the progress table's newest row, every table at that row's version."""
    rows = read_delta(f"{lake}/_changelake_consistency").to_pylist()
    row = max(rows, key=lambda r: r["batch_id"])
    tables = {}
    for name, version in row["tables"]:
        key, cols = VIEW_TABLES.get(name, ("id", th.TABLES.get(name)))
        got = read_delta(f"{lake}/{name}", version=version, columns=cols).to_pylist()
        tables[name] = {r[key]: r for r in got}
    return row, tables


def violations(tables: dict[str, dict]) -> list[str]:
    """The invariants a reader checks on the views alone and against the mirrors of the same snapshot."""
    found = []
    totals = tables.get("balance_total", {})
    if totals and sum(r["total"] for r in totals.values()) != th.TOTAL:
        found.append(f"balance total {sum(r['total'] for r in totals.values())} != {th.TOTAL}")
    mirrors = {t: tables.get(t, {}) for t in th.TABLES}
    expected = views_of(mirrors)
    for view in ("customer_qty", "top_accounts"):
        if view in tables and tables[view] != expected[view]:
            found.append(f"{view} is not the view of the mirrors")
    return found


def _run(processor: BatchProcessor, batch: pa.RecordBatch, batch_id: int):
    out = pa.Table.from_batches(list(processor.stage(iter([batch]))))
    return processor.process_decoded(out, batch_id)


def _check(row: dict, tables: dict, history: th.History, where: str) -> None:
    state = history.states[row["transactions"]]
    expected = {**{t: rows for t, rows in state.items() if rows},
                **{v: rows for v, rows in views_of(state).items() if rows}}
    assert {t: rows for t, rows in tables.items() if rows} == expected, where


@pytest.mark.parametrize("seed", [1, 3])
def test_every_view_snapshot_is_the_view_of_a_state_the_database_had(tmp_path, seed):
    config = parse_config(yaml.safe_dump(config_of(str(tmp_path / "lake"), str(tmp_path / "ckpt"))))
    history = th.generate(seed, transactions=40)
    processor = BatchProcessor(config)
    assert processor.driver_graph is not None and processor.executor_plan is None
    batches = th.random_batches(history, seed)
    held = 0
    for b, batch in enumerate(batches):
        report = _run(processor, batch, b)
        held += report.transactions["held_rows"]
        row, tables = snapshot(str(tmp_path / "lake"))
        assert row["batch_id"] == b
        assert violations(tables) == [], f"seed {seed} batch {b}"
        _check(row, tables, history, f"seed {seed} batch {b}")
    assert held, "the batches should have cut through transactions"
    assert set(row_tables := dict(row["tables"])) >= set(VIEW_TABLES), row_tables    # views' versions recorded
    assert row["transactions"] == len(history.states) - 1


def test_views_state_survives_a_crash_between_two_tables_and_a_restart(tmp_path, monkeypatch):
    """The batch's second table commit fails (the first went in); a new process replays it from the
    checkpoint: the views' operator state and the held rows come back as the batch before left them."""
    seed = 7
    lake = str(tmp_path / "lake")
    config = parse_config(yaml.safe_dump(config_of(lake, str(tmp_path / "ckpt"))))
    history = th.generate(seed, transactions=30)
    batches = th.random_batches(history, seed)
    processor = BatchProcessor(config)
    crashed = []
    for b, batch in enumerate(batches):
        if b % 3 == 2:          # this batch's second table commit fails, whichever table it is
            sink_type = type(processor._sink("customer_qty"))
            assert all(type(processor._sink(t)) is sink_type for t in th.TABLES)
            original, calls, lock = sink_type.apply, [], threading.Lock()

            def failing(self, changes, **kw):
                with lock:
                    calls.append(self.spec.name)
                    second = len(calls) == 2
                if second:
                    raise RuntimeError("killed between two tables' commits")
                return original(self, changes, **kw)

            monkeypatch.setattr(sink_type, "apply", failing)
            try:
                _run(processor, batch, b)
            except RuntimeError:
                crashed.append(b)
                processor = BatchProcessor(config)      # a new process: state from the checkpoint only
            finally:
                monkeypatch.undo()
            if crashed[-1:] != [b]:
                row, tables = snapshot(lake)
                _check(row, tables, history, f"batch {b}")
                continue
        _run(processor, batch, b)
        row, tables = snapshot(lake)
        assert row["batch_id"] == b
        _check(row, tables, history, f"batch {b} (crashed in {crashed})")
    assert len(crashed) >= 3, crashed
    ids = read_delta(config.consistency_table_path(), columns=["batch_id"])["batch_id"].to_pylist()
    assert sorted(ids) == list(range(len(batches)))      # one progress row per batch, none twice
    assert snapshot(lake)[0]["transactions"] == len(history.states) - 1
