"""A NULL key is a key like any other in every keyed kernel (SQL's GROUP BY / PARTITION BY), and
matches nothing in a join's equi-key (SQL's ``=``).

The keyed kernels are checked by substitution: the same changelog with the NULL key replaced by
a value no row has must give the same output, with that value in place of the NULL. Every batch
goes through a snapshot and restore, so the state's on-disk form holds NULL keys too.
"""

from __future__ import annotations

import pytest

from changelake.operators import (
    AggCall,
    Deduplicate,
    DeduplicateConfig,
    GroupAggregate,
    GroupAggregateConfig,
    RankConfig,
    SinkUpsertMaterializer,
    SinkUpsertMaterializerConfig,
    SortColumn,
    StreamingJoin,
    StreamingJoinConfig,
    make_rank,
)
from changelake.operators._rows import Changes

pytestmark = pytest.mark.unit

STAND_IN = "<no such value>"

#: rows (k, id, v); k is the key under test
CHANGELOG = [
    [("+I", (None, 1, 5)), ("+I", (None, 2, 7)), ("+I", ("a", 3, 1)), ("+I", (None, 4, 9))],
    [("-U", (None, 2, 7)), ("+U", ("a", 2, 7)), ("-D", (None, 4, 9)), ("+I", (None, 5, 3))],
    [("-U", ("a", 3, 1)), ("+U", (None, 3, 8)), ("-U", (None, 1, 5)), ("+U", (None, 1, 6))],
    [("-D", (None, 5, 3)), ("-D", (None, 3, 8)), ("-D", (None, 1, 6))],
]
INSERTS = [[c for c in batch if c[0] == "+I"] for batch in CHANGELOG]
#: upserts by id, each row staying in its partition (what the Top-N 'update' strategy takes)
UPSERTS = [[("+I", (None, 1, 5)), ("+I", (None, 2, 7)), ("+I", ("a", 3, 1)), ("+I", (None, 4, 2))],
           [("+U", (None, 1, 9)), ("+U", ("a", 3, 4)), ("+U", (None, 2, 1))]]


def _swap(value, old, new):
    return new if value == old else value


def _substituted(batches, old, new, column=0):
    return [[(kind, tuple(_swap(v, old, new) if i == column else v for i, v in enumerate(row)))
             for kind, row in batch] for batch in batches]


def _run(kernel_cls, config, batches) -> list[tuple[str, tuple]]:
    kernel, out = kernel_cls(config), Changes()
    for batch in batches:
        out.extend(kernel.process(Changes.of(batch)))
        out.extend(kernel.finish())
        kernel = type(kernel).restore(config, kernel.snapshot())
    return out.as_pairs()


def _null_is_one_key(kernel_cls, config, batches) -> list[tuple[str, tuple]]:
    with_null = _run(kernel_cls, config, batches)
    stand_in = _run(kernel_cls, config, _substituted(batches, None, STAND_IN))
    assert with_null == [(kind, tuple(_swap(v, STAND_IN, None) for v in row)) for kind, row in stand_in]
    assert any(row[0] is None for _, row in with_null)
    return with_null


def _final(pairs) -> list[tuple]:
    """The rows a changelog leaves (+I/+U add a row, -U/-D remove one)."""
    rows: list[tuple] = []
    for kind, row in pairs:
        if kind in ("+I", "+U"):
            rows.append(row)
        else:
            rows.remove(row)
    return sorted(rows, key=repr)


def test_group_aggregate_gives_null_a_group_of_its_own():
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"), AggCall("SUM", 2),
                                                               AggCall("COUNT", 1, distinct=True)))
    out = _null_is_one_key(GroupAggregate, config, CHANGELOG)
    assert ("+U", (None, 3, 21, 3)) in out and _final(out) == [("a", 1, 7, 1)]   # the NULL group came and went
    mini = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"),), mini_batch_size=2,
                                generate_update_before=False)
    _null_is_one_key(GroupAggregate, mini, CHANGELOG)


@pytest.mark.parametrize("keep, insert_only", [("last", False), ("last", True), ("first", True)])
def test_deduplicate_keeps_one_row_for_the_null_key(keep, insert_only):
    config = DeduplicateConfig(keys=(0,), keep=keep, input_insert_only=insert_only)
    _null_is_one_key(Deduplicate, config, INSERTS if insert_only else CHANGELOG)


@pytest.mark.parametrize("strategy, insert_only, n", [
    ("retract", False, 2), ("update", False, 2), ("append_only", True, 2), ("append_only_first_n", True, 2),
    ("fast_top1", True, 1)])
def test_top_n_gives_null_a_partition_of_its_own(strategy, insert_only, n):
    config = RankConfig(strategy=strategy, partition_keys=(0,), sort_keys=(SortColumn(2, False, True),),
                        rank_end=n, output_rank_number=True, row_key=(1,))
    _null_is_one_key(make_rank, config, UPSERTS if strategy == "update" else INSERTS if insert_only else CHANGELOG)


def test_sink_upsert_materializer_keeps_the_null_key():
    _null_is_one_key(SinkUpsertMaterializer, SinkUpsertMaterializerConfig(keys=(0,)), CHANGELOG)


@pytest.mark.parametrize("join_type, expected", [
    ("INNER", [("a", 3, 1, "a", 30)]),
    ("LEFT", [(None, 1, 5, None, None), ("a", 3, 1, "a", 30)]),
    ("FULL", [(None, 1, 5, None, None), ("a", 3, 1, "a", 30), (None, None, None, None, 10)]),
])
def test_a_join_matches_no_null_key_not_even_another_null(join_type, expected):
    config = StreamingJoinConfig(join_type=join_type, left_key=(0,), right_key=(0,), left_arity=3, right_arity=2)
    join = StreamingJoin(config)
    out = join.process(Changes.of([("+I", (None, 1, 5)), ("+I", ("a", 3, 1))]), side="left")
    out.extend(join.process(Changes.of([("+I", (None, 10)), ("+I", ("a", 30))]), side="right"))
    out.extend(join.finish())
    assert _final(out.as_pairs()) == sorted(expected, key=repr)
