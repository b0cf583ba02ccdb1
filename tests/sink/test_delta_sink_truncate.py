"""Truncates in the Delta upsert sink (``on_truncate: apply``), on every engine present.

A truncate at position T empties the table as of T: rows older than T go, changes older than T
that arrive later stay out, changes newer than T apply, whichever batch they come in; the table
remembers T, and a replayed batch applies it once.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import seq_from_kafka
from changelake.errors import SinkCommitError
from changelake import metrics

from .tables import KIND_CODES, changes, live, seq


def _metric(table: str) -> float:
    return metrics.REGISTRY.get_sample_value("changelake_truncated_rows_total", {"table": table}) or 0.0


def test_truncate_empties_the_table_at_its_position(make_sink):
    sink = make_sink(name="trunc_pos")
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 2, "b"), ("+I", 3, 9, "written after the truncate")]),
               batch_id=0)
    before = _metric("trunc_pos")
    # one batch: a change before the truncate (dropped), the truncate at 5, a change after it
    result = sink.apply(changes([("+U", 1, 4, "a-before"), ("+I", 4, 6, "d-after")]), batch_id=1,
                        truncate_at=seq(5))
    assert live(sink.spec.path) == {3: ("written after the truncate", seq(9)), 4: ("d-after", seq(6))}
    assert (result.truncated, result.before_truncate) == (2, 1)
    assert _metric("trunc_pos") - before == 2
    # later batches: older late changes stay out, newer ones apply
    late = sink.apply(changes([("+I", 1, 3, "late"), ("-D", 3, 2, None), ("+I", 5, 7, "e")]), batch_id=2)
    assert live(sink.spec.path) == {3: ("written after the truncate", seq(9)), 4: ("d-after", seq(6)),
                                    5: ("e", seq(7))}
    assert late.before_truncate == 2


def test_an_older_truncate_than_the_recorded_one_changes_nothing(make_sink):
    sink = make_sink(name="trunc_old")
    sink.apply(changes([("+I", 1, 10, "a")]), batch_id=0, truncate_at=seq(5))
    result = sink.apply(changes([("+I", 2, 11, "b")]), batch_id=1, truncate_at=seq(3))
    assert result.truncated == 0
    assert live(sink.spec.path) == {1: ("a", seq(10)), 2: ("b", seq(11))}


def test_a_truncate_alone_empties_an_existing_table(make_sink):
    sink = make_sink(name="trunc_alone")
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 2, "b")]), batch_id=0)
    result = sink.apply(changes([]), batch_id=1, truncate_at=seq(3))
    assert result.truncated == 2 and live(sink.spec.path) == {}


def test_a_replayed_batch_applies_its_truncate_once(make_sink, tmp_path):
    """A crash after the truncate's commits but before the batch's MERGE: the replay ends like a clean run."""
    path = str(tmp_path / "crashed" / "t")
    sink = make_sink(path=path)
    sink.apply(changes([("+I", 1, 1, "a"), ("+I", 2, 2, "b")]), batch_id=0)
    merge = sink._merge_table

    def crash(*args, **kwargs):
        raise RuntimeError("killed before the table MERGE")

    sink._merge_table = crash
    batch = changes([("+I", 3, 4, "c")])
    with pytest.raises(SinkCommitError):
        sink.apply(batch, batch_id=1, truncate_at=seq(3))
    assert live(path) == {}                               # the delete committed, the MERGE did not
    sink._merge_table = merge
    replay = make_sink(path=path)                         # a restarted process
    result = replay.apply(batch, batch_id=1, truncate_at=seq(3))
    assert result.committed and live(path) == {3: ("c", seq(4))}
    assert not replay.apply(batch, batch_id=1, truncate_at=seq(3)).committed


def _kafka_changes(rows):
    """``(kind, id, partition, offset, v)`` rows with Kafka-position ordering tokens."""
    return pa.table({
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "v": pa.array([r[4] for r in rows], pa.string()),
        "_kind": pa.array([int(KIND_CODES[r[0]]) for r in rows], pa.int8()),
        "_seq": pa.array([seq_from_kafka(r[2], r[3]) for r in rows], pa.string()),
    })


def test_a_truncate_at_a_kafka_position_orders_within_its_partition(make_sink):
    sink = make_sink(name="trunc_kafka")
    sink.apply(_kafka_changes([("+I", 1, 0, 5, "a"), ("+I", 2, 0, 20, "b")]), batch_id=0)
    sink.apply(_kafka_changes([("+I", 3, 0, 30, "c")]), batch_id=1, truncate_at=seq_from_kafka(0, 10))
    assert {k: v for k, (v, _) in live(sink.spec.path).items()} == {2: "b", 3: "c"}


def test_a_truncate_at_a_kafka_position_refuses_other_partitions(make_sink):
    sink = make_sink(name="trunc_parts")
    sink.apply(_kafka_changes([("+I", 1, 1, 5, "a")]), batch_id=0)
    with pytest.raises(SinkCommitError, match="partition 0, offset 10.*one partition"):
        sink.apply(_kafka_changes([]), batch_id=1, truncate_at=seq_from_kafka(0, 10))
    other = make_sink(name="trunc_parts_later")
    other.apply(_kafka_changes([("+I", 1, 0, 5, "a")]), batch_id=0, truncate_at=seq_from_kafka(0, 3))
    with pytest.raises(SinkCommitError, match="other partitions"):
        other.apply(_kafka_changes([("+I", 2, 2, 1, "b")]), batch_id=1)


# --- unavailable values (an unchanged TOASTed Postgres column) --------------------------------------

PLACEHOLDER = "__debezium_unavailable_value"


def test_a_placeholder_keeps_the_stored_value(make_sink):
    sink = make_sink(name="toast", unavailable_value=PLACEHOLDER)
    sink.apply(changes([("+I", 1, 1, "big text"), ("+I", 2, 1, "other")]), batch_id=0)
    # key 1: the update did not send v; key 3: +I then +U without v in one batch; key 4: never seen
    sink.apply(changes([("+U", 1, 2, PLACEHOLDER), ("+I", 3, 2, "c"), ("+U", 3, 3, PLACEHOLDER),
                        ("+U", 4, 2, PLACEHOLDER)]), batch_id=1)
    assert live(sink.spec.path) == {1: ("big text", seq(2)), 2: ("other", seq(1)), 3: ("c", seq(3)),
                                    4: (None, seq(2))}
    # a delete in between: the re-insert's placeholder has nothing to keep
    sink.apply(changes([("-D", 2, 4, None), ("+I", 2, 5, PLACEHOLDER), ("+U", 1, 6, "new text")]), batch_id=2)
    assert live(sink.spec.path)[2] == (None, seq(5)) and live(sink.spec.path)[1] == ("new text", seq(6))


def test_without_a_placeholder_setting_the_text_is_a_value(make_sink):
    sink = make_sink(name="toast_off")
    sink.apply(changes([("+I", 1, 1, "a"), ("+U", 1, 2, PLACEHOLDER)]), batch_id=0)
    assert live(sink.spec.path) == {1: (PLACEHOLDER, seq(2))}


def test_a_placeholder_after_a_null_in_the_same_batch_is_null(make_sink):
    # The update set v to NULL, the next one did not send v: v is still NULL, not the stored text.
    sink = make_sink(name="toast_null", unavailable_value=PLACEHOLDER)
    sink.apply(changes([("+I", 1, 1, "big text")]), batch_id=0)
    sink.apply(changes([("+U", 1, 2, None), ("+U", 1, 3, PLACEHOLDER)]), batch_id=1)
    assert live(sink.spec.path) == {1: (None, seq(3))}
