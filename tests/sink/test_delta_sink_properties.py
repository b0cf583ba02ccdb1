"""Property: any delivery order and batching of a change history ends in the latest change per key."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import AROUND_THE_BATCH, SUITE_ENV, engine_fixture
from .tables import changes, live, seq, tombstones

engine = engine_fixture(AROUND_THE_BATCH)

_paths = itertools.count()


@st.composite
def deliveries(draw):
    """A change history of a few keys, shuffled across keys and batches, cut into batches."""
    history = []
    next_seq = itertools.count(1)
    for key in range(draw(st.integers(1, 6))):
        for _ in range(draw(st.integers(1, 6))):
            kind = draw(st.sampled_from(["+I", "+U", "-D"]))
            n = next(next_seq)
            value = None if kind == "-D" else draw(st.sampled_from(["a", "b", "c", None]))
            history.append((kind, key, n, value))
            if kind == "+U" and draw(st.booleans()):
                history.append(("-U", key, n, "before-image"))
    order = draw(st.permutations(history))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(order)), max_size=5))))
    bounds = [0, *cuts, len(order)]
    batches = [order[a:b] for a, b in itertools.pairwise(bounds)]
    return history, batches


def _latest_per_key(history):
    latest = {}
    for change in history:
        kind, key, n, _ = change
        if kind != "-U" and (key not in latest or n > latest[key][2]):
            latest[key] = change
    return latest


#: delta-rs draws 40 histories; delta-spark, whose MERGE of a batch costs Spark jobs (1-3 s here, a history
#: up to 6 batches), draws 4 per form (8 with ``make test-delta-spark``): the rule under test is the kernel's, shared by every engine
ON_DELTA_RS = [p for p in AROUND_THE_BATCH if p.values[0] == "delta-rs"]
ON_DELTA_SPARK = [p for p in AROUND_THE_BATCH if p.values[0] != "delta-rs"]
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("engine", ON_DELTA_RS, indirect=True)
@settings(max_examples=40, **_SETTINGS)
@given(delivery=deliveries())
def test_any_batching_and_order_ends_in_each_keys_latest_change(make_sink, tmp_path, delivery):
    _check_latest_change_wins(make_sink, tmp_path, delivery)


@pytest.mark.parametrize("engine", ON_DELTA_SPARK, indirect=True)
@settings(max_examples=8 if os.environ.get(SUITE_ENV) else 4, **_SETTINGS)
@given(delivery=deliveries())
def test_any_batching_and_order_ends_in_each_keys_latest_change_on_delta_spark(make_sink, tmp_path, delivery):
    _check_latest_change_wins(make_sink, tmp_path, delivery)


def _check_latest_change_wins(make_sink, tmp_path, delivery) -> None:
    history, batches = delivery
    sink = make_sink(path=str(tmp_path / f"prop{next(_paths)}" / "t"))
    for batch_id, batch in enumerate(batches):
        sink.apply(changes(batch), batch_id=batch_id)

    latest = _latest_per_key(history)
    expected_live = {key: (v, seq(n)) for key, (kind, _, n, v) in latest.items() if kind != "-D"}
    assert live(sink.spec.path) == expected_live
    tombs = tombstones(sink.tombstone_path)
    for key, (kind, _, n, _) in latest.items():
        if kind == "-D":
            assert tombs.get(key) == seq(n), "a key whose latest change is a delete keeps that tombstone"
        else:
            assert tombs.get(key, "") < seq(n), "a live row is never older than its key's tombstone"
