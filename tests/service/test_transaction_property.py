"""Property: with ``consistency: transaction``, every committed state of every table, mirrors and views alike,
is the source database's state after some transaction, and the progress table says which.

Hypothesis draws a history of multi-table transactions (transfers, orders with lines, cancellations; the
changes of one transaction spread over three topics of four partitions, some ENDs counting a table the
pipeline does not read), micro-batch boundaries cut at random per partition, and crashes at random points:
a table commit that fails after some of the batch's tables went in, then a new process from the checkpoint
only. After every batch: the tables at the progress table's newest row are the state after its
``transactions``-th transaction and the views (a join + aggregate, an aggregate, a Top-N) are those views of
that state; at the end, the last state; one progress row per batch.
"""

from __future__ import annotations

import tempfile
import threading

import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.connectors.delta_read import read_delta
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from tests import txn_history as th
from tests.service.test_transaction_views import config_of, snapshot, views_of

pytestmark = pytest.mark.unit


def _run(processor: BatchProcessor, batch: pa.RecordBatch, batch_id: int):
    out = pa.Table.from_batches(list(processor.stage(iter([batch]))))
    return processor.process_decoded(out, batch_id)


def _crashing(processor: BatchProcessor, after: int):
    """A sink ``apply`` that fails on the batch's ``after``-th table commit (0: the first)."""
    sink_type = type(processor._sink("accounts"))
    original, calls, lock = sink_type.apply, [], threading.Lock()

    def apply(self, changes, **kw):
        with lock:
            calls.append(self.spec.name)
            mine = len(calls) - 1
        if mine == after:
            raise RuntimeError("crash")
        return original(self, changes, **kw)

    return sink_type, apply


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), transactions=st.integers(4, 14), step=st.integers(1, 5),
       crashes=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=3))
def test_every_committed_state_is_one_the_source_had(seed, transactions, step, crashes):
    history = th.generate(seed, transactions=transactions)
    batches = th.random_batches(history, seed, max_step=step)
    crash_at = dict(crashes)
    with tempfile.TemporaryDirectory() as tmp:
        lake = f"{tmp}/lake"
        config = parse_config(yaml.safe_dump(config_of(lake, f"{tmp}/ckpt")))
        processor = BatchProcessor(config)
        for b, batch in enumerate(batches):
            if b in crash_at:
                sink_type, failing = _crashing(processor, crash_at[b])
                original = sink_type.apply
                sink_type.apply = failing
                try:
                    _run(processor, batch, b)
                    crashed = False
                except RuntimeError:
                    crashed = True
                finally:
                    sink_type.apply = original
                if crashed:
                    processor = BatchProcessor(config)       # a new process: the checkpoint only
                    _run(processor, batch, b)
            else:
                _run(processor, batch, b)
            row, tables = snapshot(lake)
            assert row["batch_id"] == b
            state = history.states[row["transactions"]]
            expected = {t: v for t, v in {**state, **views_of(state)}.items() if v}
            assert {t: v for t, v in tables.items() if v} == expected, f"batch {b}"
        assert row["transactions"] == len(history.states) - 1
        ids = read_delta(config.consistency_table_path(), columns=["batch_id"])["batch_id"].to_pylist()
        assert sorted(ids) == list(range(len(batches)))
