from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.plan.physical import sink_changes

pytestmark = pytest.mark.unit


def test_sequenced_by_batch_and_position_and_a_last_retraction_becomes_a_delete():
    changes = pa.table({"k": [1, 2, 1, 3, 3], "v": ["a", "b", "a", "c", "d"],
                        "_kind": pa.array([0, 1, 1, 1, 2], pa.int8())})
    out = sink_changes(changes, primary_key=["k"], batch_id=7)
    # key 1: +I then -U (its +U went elsewhere): a delete; key 2: a lone -U: a delete;
    # key 3: -U then +U: the -U stays a before-image
    assert out["_kind"].to_pylist() == [0, 3, 3, 1, 2]
    seqs = out["_seq"].to_pylist()
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    later = sink_changes(changes.slice(0, 1), primary_key=["k"], batch_id=8)["_seq"][0].as_py()
    assert later > seqs[-1]
