"""The conformance harness must be able to fail: its comparisons and its driving of a kernel."""

import pytest

from changelake.operators._rows import INSERT
from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig
from tests.operators.harness import KernelDriver, compare, run_case

SORTED = {"mode": "sorted_by_kind_then_column", "column": 0}


def rec(kind, *row):
    return ("R", kind, list(row))


def test_exact_rejects_reordering():
    assert compare([rec("+I", 1), rec("+I", 2)], [rec("+I", 1), rec("+I", 2)], "exact") is None
    assert "expected" in compare([rec("+I", 2), rec("+I", 1)], [rec("+I", 1), rec("+I", 2)], "exact")


def test_sorted_mode_ignores_order_across_keys_but_not_within_a_key():
    assert compare([rec("+I", 2, "b"), rec("+I", 1, "a")], [rec("+I", 1, "a"), rec("+I", 2, "b")], SORTED) is None
    assert compare([rec("+I", 1, "b"), rec("+I", 1, "a")], [rec("+I", 1, "a"), rec("+I", 1, "b")], SORTED)
    assert compare([rec("-U", 1, "a")], [rec("-D", 1, "a")], SORTED)


def test_sorted_mode_pins_watermark_positions():
    mode = dict(SORTED, watermarks="positions must match exactly")
    assert compare([rec("+I", 1), ("W", 5)], [rec("+I", 1), ("W", 5)], mode) is None
    assert compare([("W", 5), rec("+I", 1)], [rec("+I", 1), ("W", 5)], mode)


def test_multiset_counts_multiplicities():
    mode = {"mode": "multiset"}
    assert compare([rec("+I", 1), rec("+I", 2)], [rec("+I", 2), rec("+I", 1)], mode) is None
    assert compare([rec("+I", 1)], [rec("+I", 1), rec("+I", 1)], mode)


class AlwaysInsert(SinkUpsertMaterializer):
    """A wrong materializer: never emits updates."""

    def _process_rows(self, batch, now, out):
        for _, row in batch:
            out.emit(INSERT, row)


def test_run_case_fails_a_wrong_kernel():
    case = {"steps": [
        {"input": {"side": "in", "kind": "+I", "row": [1, 1, "a"]}},
        {"input": {"side": "in", "kind": "+I", "row": [2, 1, "b"]}},
        {"check": {"expected": [{"kind": "+I", "row": [1, 1, "a"]}, {"kind": "+U", "row": [2, 1, "b"]}],
                   "compare": "exact", "consume": True}},
    ]}
    config = SinkUpsertMaterializerConfig(keys=(1,))
    run_case(case, KernelDriver.of(SinkUpsertMaterializer, config))
    with pytest.raises(AssertionError, match="check at step 2"):
        run_case(case, KernelDriver.of(AlwaysInsert, config))
