"""A new checkpoint restarts its batch ids at 0 with a higher generation: its writes land after the older
checkpoint's, an older checkpoint is refused, and a view's table is replaced by the new generation's first
commit (changelake.connectors.commits, changelake.changelog.commit_position)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import commit_position, split_commit_position, with_batch_seq
from changelake.connectors.dead_letters import DeadLetterStore
from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.delta_read import read_delta
from changelake.errors import SinkCommitError

from .tables import changes, live

pytestmark = pytest.mark.unit


def test_a_new_generation_writes_from_batch_0_after_an_older_one_wrote_batch_7(make_sink):
    old = make_sink(name="orders")
    for batch in range(8):
        old.apply(changes([("+I", batch, batch, f"v{batch}")]), batch_id=batch)
    new = make_sink(name="orders")
    new.generation = 1

    result = new.apply(changes([("+I", 100, 100, "after the new checkpoint")]), batch_id=0)

    assert result.committed
    assert live(new.spec.path)[100] == ("after the new checkpoint", "s0000000100")
    assert new.committed_batch_id() == 0 and old.committed_batch_id() is None
    assert split_commit_position(new.committed_position()) == (1, 0)
    assert not new.apply(changes([("+I", 101, 101, "replayed")]), batch_id=0).committed   # a replay, still


def test_an_older_generation_is_refused_after_a_newer_one_wrote(make_sink):
    new = make_sink(name="orders")
    new.generation = 2
    new.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    old = make_sink(name="orders")
    old.generation = 1
    with pytest.raises(SinkCommitError, match="newer checkpoint .*batch 0 of checkpoint generation 2"):
        old.apply(changes([("+I", 2, 2, "stale checkpoint")]), batch_id=9)
    assert 2 not in live(old.spec.path)


def view_changes(rows, *, batch_id: int, generation: int) -> pa.Table:
    """A view's output: ``_seq`` from the batch's commit position, as the pipeline gives it."""
    return with_batch_seq(changes(rows).drop_columns(["_seq"]), batch_id, generation)


def test_a_views_table_is_replaced_by_the_new_generations_first_commit_only(make_sink):
    old = make_sink(name="by_category", replace_on_new_generation=True)
    old.apply(view_changes([("+I", 1, 0, "a"), ("+I", 2, 0, "b"), ("+I", 3, 0, "stale")], batch_id=41,
                           generation=0), batch_id=41)
    new = make_sink(name="by_category", replace_on_new_generation=True)
    new.generation = 1

    new.apply(view_changes([("+I", 1, 0, "a2"), ("+I", 2, 0, "b2")], batch_id=0, generation=1), batch_id=0)
    assert {k: v for k, (v, _) in live(new.spec.path).items()} == {1: "a2", 2: "b2"}   # key 3 was stale

    new.apply(view_changes([("+I", 4, 0, "d")], batch_id=1, generation=1), batch_id=1)  # later: a plain merge
    assert {k: v for k, (v, _) in live(new.spec.path).items()} == {1: "a2", 2: "b2", 4: "d"}


def test_a_views_table_with_no_row_in_the_new_generations_first_batch_is_emptied(make_sink):
    old = make_sink(name="v", replace_on_new_generation=True)
    old.apply(view_changes([("+I", 1, 0, "a")], batch_id=3, generation=0), batch_id=3)
    new = make_sink(name="v", replace_on_new_generation=True)
    new.generation = 1
    assert new.apply(view_changes([], batch_id=0, generation=1), batch_id=0).committed
    assert live(new.spec.path) == {}


def test_a_newer_generations_view_seq_sorts_above_every_older_batch():
    old = with_batch_seq(pa.table({"x": [1]}), (1 << 40) - 1, 0)["_seq"][0].as_py()
    new = with_batch_seq(pa.table({"x": [1]}), 0, 1)["_seq"][0].as_py()
    legacy = with_batch_seq(pa.table({"x": [1]}), 7)["_seq"][0].as_py()
    assert new > old and legacy == "b" + f"{7:020d}" + f"{0:020d}"
    assert commit_position(7) == 7                       # generation 0: the batch id, as before generations


def _letters(n: int) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)), "timestamp": [None] * n,
                     "key": [None] * n, "value": [b"{not json"] * n, "reason": ["malformed"] * n,
                     "error": ["bad"] * n}, schema=DEAD_LETTER_SCHEMA)


def test_dead_letters_of_a_new_generation_are_kept_and_an_older_one_is_refused(tmp_path):
    path = str(tmp_path / "_dead_letters")
    assert DeadLetterStore(path, pipeline_id="p").append(_letters(2), source="s", batch_id=7)
    assert DeadLetterStore(path, pipeline_id="p", generation=1).append(_letters(3), source="s", batch_id=0)
    assert read_delta(path).num_rows == 5
    assert not DeadLetterStore(path, pipeline_id="p", generation=1).append(_letters(3), source="s", batch_id=0)
    with pytest.raises(SinkCommitError, match="newer checkpoint"):
        DeadLetterStore(path, pipeline_id="p").append(_letters(1), source="s", batch_id=8)
