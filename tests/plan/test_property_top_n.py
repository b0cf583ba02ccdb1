"""Property: random CDC histories of one table (inserts, updates that move rows between partitions
and ranks, deletes, at-least-once re-deliveries) through Top-N — with and without ``partition_by``,
with and without a rank column, single-level and two-level — into Delta tables, end equal to
``ROW_NUMBER() OVER (...) <= n`` run in batch by DuckDB over the source's final state.

``order_by`` ends with the unique ``id``, so the Top-N is a function of the final rows (ties on
``v`` would otherwise be broken by arrival order, which the two levels see differently). The plan
runs in-process (:class:`LocalRunner`); ``tests/spark/test_two_level_top_n.py`` holds Spark to it.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.types import arrow_schema

from .histories import deliver, key_histories

pytestmark = pytest.mark.unit

ITEMS = {"id": "bigint", "g": "string", "v": "int"}
SCHEMA = arrow_schema(ITEMS)
#: (table suffix, partition_by, rank_column)
VARIANTS = [("global", (), None), ("global_rnk", (), "rnk"), ("by_g", ("g",), None), ("by_g_rnk", ("g",), "rnk")]


def pipeline(n: int, k: int) -> Pipeline:
    p = Pipeline()
    items = p.source("items", columns=ITEMS, primary_key=["id"])
    for suffix, partition_by, rank_column in VARIANTS:
        for levels, two_level in (("one", None), ("two", k)):
            name = f"{levels}_{suffix}"
            key = [*partition_by, rank_column] if rank_column else ["id"]
            items.top_n(n, order_by=["v desc nulls first", "id"], partition_by=partition_by, rank_column=rank_column,
                        two_level=two_level, name=name).to_table(name, primary_key=key)
    return p


def oracle(final: dict[int, tuple], n: int) -> dict[str, set[tuple]]:
    cols = list(zip(*final.values())) if final else [[] for _ in SCHEMA]
    con = duckdb.connect()
    con.register("items", pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, SCHEMA)],
                                               names=SCHEMA.names))
    out = {}
    for suffix, partition_by, rank_column in VARIANTS:
        over = ("PARTITION BY g " if partition_by else "") + "ORDER BY v DESC NULLS FIRST, id"
        rows = con.sql(f"SELECT id, g, v, row_number() OVER ({over}) AS rnk FROM items").fetchall()
        want = {r if rank_column else r[:3] for r in rows if r[3] <= n}
        out[f"one_{suffix}"] = out[f"two_{suffix}"] = want
    con.close()
    return out


def changelog(rows: list) -> pa.Table:
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in SCHEMA]
    return pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, SCHEMA)]
                                + [pa.array([k for k, _ in rows], pa.int8())], names=SCHEMA.names + [KIND])


def run(plan, batches: list[pa.Table], root: Path) -> dict[str, set[tuple]]:
    runner = LocalRunner(plan)
    sinks = {s.table: open_sink(TableSpec(name=s.table, path=str(root / s.table), primary_key=s.primary_key),
                                pipeline_id="prop-topn", engine="delta-rs") for s in plan.sinks}
    for b, batch in enumerate(batches):
        for table, changes in runner.step({"items": batch}).items():
            if not changes.num_rows:
                continue                    # a commit of nothing: skipped, to keep the test fast
            sink = sinks[table]
            sink.apply(sink_changes(changes, primary_key=sink.spec.primary_key, batch_id=b), batch_id=b)
    out = {}
    for s in plan.sinks:
        path = root / s.table
        out[s.table] = set() if not (path / "_delta_log").exists() else {
            tuple(r.values()) for r in read_delta(str(path), columns=s.schema.names).to_pylist()}
    return out


item_op = st.tuples(st.integers(1, 12), st.sampled_from(["a", "b", "c"]),
                    st.one_of(st.none(), st.integers(0, 6)), st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(item_op, max_size=30), n=st.integers(1, 3), k=st.integers(2, 4),
       rnd=st.randoms(use_true_random=False))
def test_single_and_two_level_top_n_equal_row_number_over_the_final_state(tmp_path_factory, ops, n, k, rnd):
    per_key, final = key_histories(ops, "items")
    delivered = deliver(per_key, rnd)
    batches, i = [], 0
    while i < len(delivered):
        size = rnd.randint(1, 10)
        batches.append(changelog([(kind, row) for msg in delivered[i:i + size] for _, kind, row in msg]))
        i += size
    got = run(pipeline(n, k).plan(), batches, tmp_path_factory.mktemp("lake"))
    want = oracle(final, n)
    for table, rows in want.items():
        assert got[table] == rows, table


def test_the_property_pipeline_has_both_plans_of_each_variant():
    plan = pipeline(2, 3).plan()
    ranks = [n.id for n in plan if n.op == "rank"]
    assert ranks == [r for s, _, _ in VARIANTS for r in (f"one_{s}", f"two_{s}_local", f"two_{s}")]
    assert any(n.op == "materialize" for n in plan)          # by_g without a rank number has no upsert key
