"""``pipeline.max_hold``: a source transaction that can never complete is not held forever.

Two ways a transaction never completes: its END is read but some of its changes never are (they expired
from a table topic, or were produced before the pipeline's start), which keeps every later transaction
waiting behind it; or its changes are read and its END never is. The batch clock is driven by the test
(ten seconds per batch); with ``max_hold: 5 minutes`` the transaction is applied as it is (split) once held
that long, a warning names it and ``changelake_transactions_expired_total`` counts it; with
``max_hold: null`` it is still held at the end.
"""

from __future__ import annotations

import orjson
import pytest

from changelake import metrics
from changelake.service import transactions
from changelake.service.pipeline import BatchProcessor
from tests import txn_history as th
from tests.service.test_transaction_consistency import _config, _run, consistent_snapshot

pytestmark = pytest.mark.unit

EXPIRED = "changelake_transactions_expired_total"


def _without(history: th.History, txn: str, *, changes: bool) -> th.History:
    """``history`` without the change records of ``txn`` (``changes``) or without its END."""
    out = th.History(states=history.states)
    for (topic, partition), recs in history.records.items():
        for key, value in recs:
            body = orjson.loads(value) if value is not None else {}
            if changes and (body.get("transaction") or {}).get("id") == txn:
                continue
            if not changes and body.get("status") == "END" and body.get("id") == txn:
                continue
            out.append(topic, partition, key, value)
        out.records.setdefault((topic, partition), [])
    return out


def _drive(tmp_path, monkeypatch, history: th.History, max_hold: str | None):
    clock = [1_000_000.0]
    monkeypatch.setattr(transactions.time, "time", lambda: clock[0])
    config = _config(tmp_path, max_hold=max_hold)
    processor = BatchProcessor(config, graph=None)
    batches = th.random_batches(history, 9)
    idle = [batches[0].slice(0, 0)] * 40
    for b, batch in enumerate(batches + idle):      # then idle batches: the clock goes on
        _run(processor, batch, b)
        clock[0] += 10
    return consistent_snapshot(config)


def _txn(history: th.History, k: int) -> str:
    ends = [orjson.loads(v) for (topic, _), recs in history.records.items() if topic == th.TXN_TOPIC
            for _, v in recs]
    return [e["id"] for e in ends if e["status"] == "END"][k]


@pytest.mark.parametrize("lost", ["changes", "end"])
def test_a_transaction_that_cannot_complete_is_applied_after_max_hold(tmp_path, monkeypatch, caplog, lost):
    history = th.generate(9, transactions=30)
    k = 10
    txn = _txn(history, k)
    broken = _without(history, txn, changes=lost == "changes")
    before = metrics.REGISTRY.get_sample_value(EXPIRED) or 0
    with caplog.at_level("WARNING"):
        row, tables = _drive(tmp_path / "bounded", monkeypatch, broken, "5 minutes")
    assert (metrics.REGISTRY.get_sample_value(EXPIRED) or 0) - before == 1
    assert f"source transaction {txn.split(':')[0]} held for" in caplog.text   # (matched by its txId) and "longer than pipeline.max_hold (300s)" in caplog.text
    assert row["held_rows"] == 0
    if lost == "end":       # every change was read: all of them are in, late
        assert tables == history.states[-1]
        assert row["transactions"] == len(history.states) - 2          # every one but the END-less one
    else:                   # the transactions behind it went in once it was let go
        assert row["transactions"] == len(history.states) - 2

    row, _ = _drive(tmp_path / "unbounded", monkeypatch, broken, None)
    assert row["held_rows"] > 0 or row["transactions"] <= k, row        # without a bound: still waiting
