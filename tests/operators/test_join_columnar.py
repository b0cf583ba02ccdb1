"""The columnar join bundle (``StreamingJoin``) against the row-by-row reference (``RowByRowStreamingJoin``).

On random changelogs (NULL keys, duplicate rows, retractions of rows never stored, float keys with
NaN and -0.0 that the columnar fold hands back to the rows, 64-bit and Unicode values), fed as Arrow
batches or row tuples in random batch sizes with snapshots and restores in between, both kernels
must emit the same records in the same order, count the same stale retractions and hold the same
state.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND
from changelake.operators._join_bundle import fold_unique
from changelake.operators._rows import Changes
from changelake.operators._state import KeyedState, decode_value, restore_stores, snapshot_stores
from changelake.operators.join_state import InputSpec
from changelake.operators.streaming_join import (
    RowByRowStreamingJoin,
    StreamingJoin,
    StreamingJoinConfig,
    fold_bundle,
)

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64()), ("d", pa.decimal128(38, 10))])
VALUES = (
    st.sampled_from([None, 0, 1, 2, 2**63 - 1, -2**63]),
    st.sampled_from([None, "x", "y", "é", "\U0001F600"]),
    st.sampled_from([None, 0.0, -0.0, math.nan, 1.5]),
    st.sampled_from([None, Decimal("0E-10"), Decimal("1.0000000000"), Decimal("99999999999999999999999999.9999999999")]),
)
KINDS = st.sampled_from(["+I", "-U", "+U", "-D"])
ROW = st.tuples(*VALUES)
#: (join key, layout, unique key) per side; a key on column 2 (float) is folded row by row
SIDE_SPECS = st.sampled_from([
    ((0,), "no_unique_key", None),
    ((0,), "join_key_contains_unique_key", (0,)),
    ((0,), "has_unique_key", (1,)),
    ((0,), "has_unique_key", (1, 3)),
    ((0, 1), "join_key_contains_unique_key", (1, 0)),
    ((2,), "has_unique_key", (0,)),
    ((2,), "join_key_contains_unique_key", (2,)),
])


def _spec(key, layout, unique) -> InputSpec:
    if layout == "join_key_contains_unique_key" and not set(unique) <= set(key):
        return InputSpec("has_unique_key", unique)
    return InputSpec(layout, unique)


def _config(join_type, left, right, size, filter_nulls, ttl):
    (lk, ll, lu), (rk, rl, ru) = left, right
    n = min(len(lk), len(rk))
    return StreamingJoinConfig(
        join_type=join_type, left_key=lk[:n], right_key=rk[:n], left_arity=4, right_arity=4,
        left_input=_spec(lk[:n], ll, lu), right_input=_spec(rk[:n], rl, ru),
        filter_null_keys=(filter_nulls,), left_state_ttl_ms=ttl, right_state_ttl_ms=ttl, mini_batch_size=size)


def _batch(records, as_arrow: bool):
    changes = Changes.of(records)
    if not as_arrow:
        return changes
    cols = {f.name: pa.array([r[i] for _, r in records], f.type) for i, f in enumerate(SCHEMA)}
    cols[KIND] = pa.array(changes.kinds, pa.int8())
    return pa.table(cols)


def _state(kernel):
    data = kernel.snapshot()
    table = pa.ipc.open_stream(data).read_all()
    return [(s, decode_value(k), decode_value(v), w) for s, k, v, w in zip(
        table["state"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), table["written_at"].to_pylist())]


def _full_snapshot(kernel) -> bytes:
    """The kernel's snapshot with every entry pickled afresh (a join side's store keeps the pickles of the
    entries no change touched since its last snapshot)."""
    plain = []
    for store in kernel._all_stores():
        copy = KeyedState(store.name, store.ttl_ms)
        for k, v, w in store.entries():
            copy.load(k, v, w)
        plain.append(copy)
    return snapshot_stores(kernel.OPERATOR, plain)


def _output(kernel, what: str, side, as_arrow, records, now: int) -> list:
    """A ``batch`` or ``finish`` step's output, as ``(kind, row)`` pairs."""
    if what == "batch":
        return kernel.process(_batch(records, as_arrow), side=side, now=now).as_pairs()
    return kernel.finish(now=now).as_pairs()


STEP = st.one_of(
    st.tuples(st.just("batch"), st.sampled_from(["left", "right"]), st.booleans(),
              st.lists(st.tuples(KINDS, ROW), max_size=12)),
    st.tuples(st.just("restore"), st.none(), st.none(), st.none()),
    st.tuples(st.just("snapshot"), st.none(), st.none(), st.none()),
    st.tuples(st.just("finish"), st.none(), st.none(), st.none()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(join_type=st.sampled_from(["INNER", "LEFT", "RIGHT", "FULL"]), left=SIDE_SPECS, right=SIDE_SPECS,
       size=st.integers(1, 20), filter_nulls=st.booleans(), ttl=st.sampled_from([0, 0, 5]),
       steps=st.lists(STEP, max_size=10))
def test_columnar_join_equals_row_by_row(join_type, left, right, size, filter_nulls, ttl, steps):
    config = _config(join_type, left, right, size, filter_nulls, ttl)
    kernels = [StreamingJoin(config), RowByRowStreamingJoin(config)]
    for now, (what, side, as_arrow, records) in enumerate(steps):
        outs = []
        for i, kernel in enumerate(kernels):
            if what in ("batch", "finish"):
                outs.append(_output(kernel, what, side, as_arrow, records, now))
            elif what == "snapshot":      # and go on with the kernel: the kept pickles of its entries
                assert kernel.snapshot() == _full_snapshot(kernel)
            else:
                kernels[i] = type(kernel).restore(config, kernel.snapshot())
        assert outs[:1] == outs[1:]
        assert kernels[0].take_figures() == kernels[1].take_figures()
    assert kernels[0].finish(now=len(steps)).as_pairs() == kernels[1].finish(now=len(steps)).as_pairs()
    assert _state(kernels[0]) == _state(kernels[1])
    assert kernels[0].snapshot() == _full_snapshot(kernels[0])
    assert kernels[0].state_rows == kernels[1].state_rows


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 3]), st.integers(0, 4), st.integers(0, 2)), max_size=30),
       st.booleans())
def test_fold_unique_equals_fold_bundle(records, key_is_unique):
    """The numpy fold keeps exactly ``fold_bundle``'s records, in its order, with its pairs."""
    kinds = np.array([k for k, _, _ in records], dtype=np.int8)
    rows = [(u, j if not key_is_unique else u % 3) for _, u, j in records]
    join = np.array([r[1] for r in rows], dtype=np.int64)
    unique = join if key_is_unique else np.array([r[0] * 10 + r[1] for r in rows], dtype=np.int64)
    spec = InputSpec("join_key_contains_unique_key", (1,)) if key_is_unique else InputSpec("has_unique_key", (0,))
    groups = fold_bundle(spec, [(int(k), r) for k, r in zip(kinds, rows)], (1,))
    expected = [(k, r, len(g) == 2) for g in groups for k, r in g]
    positions, paired = fold_unique(kinds, unique, join)
    assert [(int(kinds[p]), rows[p], bool(q)) for p, q in zip(positions, paired)] == expected


@pytest.mark.parametrize("layout", ["no_unique_key", "has_unique_key"])
def test_a_join_sides_snapshot_pickles_again_every_key_a_change_touched(layout):
    """Each change of a join key's rows in place (one more row, one retracted of several, an association
    count, a row expired by TTL) is in the next snapshot, though the key's others were pickled before."""
    from changelake.operators.join_state import JoinRecordView

    view = JoinRecordView("side", InputSpec(layout, None if layout == "no_unique_key" else (1,)), 10)

    def same() -> None:
        copy = KeyedState("side")
        for k, v, w in view.store.entries():
            copy.load(k, v, w)
        assert snapshot_stores("op", [view.store]) == snapshot_stores("op", [copy])

    for ek in ("a", "b", "c"):
        view.add((1,), (1, ek), 0)
    view.add((2,), (2, "a"), 0)
    same()
    view.add((1,), (1, "d"), 1)
    same()
    assert view.retract((1,), (1, "a"), 2)
    same()
    view.update_assoc((1,), (1, "b"), 3, 3)
    same()
    view.add((1,), (1, "e"), 9)
    same()
    assert len(view.records((1,), 11)) == 2        # b and e were written at 3 and 9; c and d expired
    same()
    assert view.records((2,), 11) == []            # every row of key 2 expired: the key goes
    same()


@pytest.mark.parametrize("layout", ["no_unique_key", "has_unique_key", "join_key_contains_unique_key"])
def test_a_restored_join_side_pickles_again_only_what_changed_and_counts_its_rows(layout):
    """A side restored from a snapshot keeps the snapshot's pickles of its entries: the next snapshot
    equals a full one after every kind of change; its row count counts a repeated row each time."""
    from changelake.operators.join_state import JoinRecordView

    spec = InputSpec(layout, {"no_unique_key": None, "has_unique_key": (1,), "join_key_contains_unique_key": (0,)}[layout])
    view = JoinRecordView("side", spec, 0)
    for jk, ek in ((1, "a"), (1, "b"), (2, "a"), (3, "c")):
        view.add((jk,), (jk, ek), 0)
    view.add((1,), (1, "a"), 0)                 # no unique key: the same row twice
    restored = JoinRecordView("side", spec, 0)
    restore_stores("op", snapshot_stores("op", [view.store]), [restored.store])

    def full(v) -> bytes:
        copy = KeyedState("side")
        for k, value, w in v.store.entries():
            copy.load(k, value, w)
        return snapshot_stores("op", [copy])

    rows = {"no_unique_key": 5, "has_unique_key": 4, "join_key_contains_unique_key": 3}[layout]
    assert len(restored) == len(view) == rows
    assert snapshot_stores("op", [restored.store]) == full(restored)
    restored.add((2,), (2, "z"), 1)
    assert restored.retract((3,), (3, "c"), 1)
    restored.update_assoc((1,), (1, "b"), 4, 1)
    assert snapshot_stores("op", [restored.store]) == full(restored) != full(view)
    assert len(restored) == rows + (0 if layout == "join_key_contains_unique_key" else 1) - 1


# -- the state in Arrow columns (_join_columnar) ----------------------------------------------------
#: sides with a unique key on exactly comparable columns: the inner join keeps its state in columns
KEYED_SPECS = {
    (0,): [((0,), "join_key_contains_unique_key", (0,)), ((0,), "has_unique_key", (1,)),
           ((0,), "has_unique_key", (1, 3)), ((0, 1), "join_key_contains_unique_key", (1, 0))],
    (1,): [((1,), "has_unique_key", (0,)), ((1,), "join_key_contains_unique_key", (1,)),
           ((1, 0), "has_unique_key", (0, 3))],
}
#: few values per column, so that several rows share a join key and rows are replaced and retracted
NARROW_ROW = st.tuples(st.sampled_from([None, 1, 2**63 - 1]), st.sampled_from([None, "x", "\U0001F600"]),
                       st.sampled_from([None, 1.5, math.nan]),
                       st.sampled_from([None, Decimal("99999999999999999999999999.9999999999")]))
NARROW_STEP = st.one_of(
    st.tuples(st.just("batch"), st.sampled_from(["left", "right"]), st.booleans(),
              st.lists(st.tuples(KINDS, NARROW_ROW), max_size=8)),
    st.tuples(st.sampled_from(["restore", "snapshot", "finish", "finish", "upgrade"]), st.none(), st.none(), st.none()),
)
#: (left, right) side specs whose join keys have equal types (the planner refuses others)
KEYED_PAIRS = st.sampled_from(list(KEYED_SPECS)).flatmap(
    lambda first: st.tuples(st.sampled_from(KEYED_SPECS[first]), st.sampled_from(KEYED_SPECS[first])))


def _sides(config, kernel) -> dict:
    """Each side's rows per join key in their order, read through the dict state (either snapshot format)."""
    dicts = RowByRowStreamingJoin.restore(config, kernel.snapshot())
    return {name: sorted(((repr(jk), [e[0] for e in entries.values()]) for jk, entries, _ in view.store.entries()),
                         key=lambda item: item[0])
            for name, view in (("left", dicts.left), ("right", dicts.right))}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sides=KEYED_PAIRS, filter_nulls=st.booleans(), size=st.sampled_from([1_000_000, 1_000_000, 3, 7]),
       steps=st.lists(NARROW_STEP, max_size=16))
def test_the_join_state_in_columns_equals_the_dicts(sides, filter_nulls, size, steps):
    """An inner join of two keyed inputs given its inputs' schemas keeps its state in Arrow columns and
    emits exactly what the row-by-row reference emits (same records, order, stale counts, state); its
    snapshot restores either way, and a snapshot of the dict state (written before) restores into it."""
    plain = _config("INNER", *sides, size, filter_nulls, 0)
    config = dataclasses.replace(plain, left_schema=SCHEMA, right_schema=SCHEMA)
    assert repr(config) == repr(plain)                        # the plan's fingerprints do not move
    kernels = [StreamingJoin(config), RowByRowStreamingJoin(plain)]
    assert kernels[0]._cols is not None
    for now, (what, side, as_arrow, records) in enumerate(steps):
        outs = []
        for i, kernel in enumerate(kernels):
            if what in ("batch", "finish"):
                outs.append(_output(kernel, what, side, as_arrow, records, now))
            elif what == "snapshot":
                kernel.snapshot()
            elif what == "upgrade" and i == 0:                  # from the dict state's snapshot (format 1)
                kernels[0] = StreamingJoin.restore(config, kernels[1].snapshot())
            elif what == "restore":
                kernels[i] = type(kernel).restore(config if i == 0 else plain, kernel.snapshot())
        assert outs[:1] == outs[1:]
        assert kernels[0].take_figures() == kernels[1].take_figures()
    assert kernels[0].finish(now=len(steps)).as_pairs() == kernels[1].finish(now=len(steps)).as_pairs()
    assert kernels[0]._cols is not None                       # it ran in columns to the end
    assert kernels[0].state_rows == kernels[1].state_rows
    assert _sides(plain, kernels[0]) == _sides(plain, kernels[1])
    restored = StreamingJoin.restore(config, kernels[0].snapshot())
    assert restored._cols is not None and _sides(plain, restored) == _sides(plain, kernels[1])


def test_a_join_in_columns_hands_its_state_to_the_dicts_when_a_batch_does_not_fit_them():
    """Rows whose values do not convert to the declared schema continue in the dict state, with the
    rows held so far, in their order."""
    plain = _config("INNER", ((0,), "has_unique_key", (1,)), ((0,), "join_key_contains_unique_key", (0,)),
                    1_000_000, True, 0)
    config = dataclasses.replace(plain, left_schema=SCHEMA, right_schema=SCHEMA)
    kernel, reference = StreamingJoin(config), RowByRowStreamingJoin(plain)
    first = [("+I", (1, "x", 0.5, None)), ("+I", (1, "y", 1.5, None))]
    for k in (kernel, reference):
        k.process(_batch(first, True), side="left")
        k.finish()
    assert kernel._cols is not None
    odd = [("+I", (1, "not a float", "x", None))]             # column c is DOUBLE in the schema
    outs = [k.process(Changes.of(odd), side="right").as_pairs() + k.finish().as_pairs() for k in (kernel, reference)]
    assert kernel._cols is None
    assert outs[0] == outs[1] and len(outs[0]) == 2
