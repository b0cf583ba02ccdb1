"""The Spark binding runs a kernel with its state in the checkpointed RocksDB state store.

The kernel itself is the oracle: a streaming query over several micro-batches, stopped and
restarted from its checkpoint, must emit per key exactly what one kernel emits over the whole input.
"""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ
from changelake.operators import (
    AggCall,
    Changes,
    Deduplicate,
    DeduplicateConfig,
    GroupAggregate,
    GroupAggregateConfig,
)
from changelake.spark.binding import apply_kernel, run_bucket

from .conftest import run_to_end, write_micro_batch

pytestmark = pytest.mark.spark

INPUT = pa.schema([("id", pa.int64()), ("category", pa.string()), ("price", pa.int64()),
                   (KIND, pa.int8()), (SEQ, pa.string())])

# Five micro-batches (one parquet file each) of a products changelog: inserts, updates
# (-U/+U pairs) that move products between categories, deletes, a re-insert after delete.
BATCHES = [
    [("+I", 1, "a", 10), ("+I", 2, "a", 20), ("+I", 3, "b", 5), ("+I", 4, "c", 7)],
    [("-U", 1, "a", 10), ("+U", 1, "b", 11), ("-D", 4, "c", 7), ("+I", 5, "c", 1)],
    [("-U", 2, "a", 20), ("+U", 2, "a", 25), ("-U", 3, "b", 5), ("+U", 3, "c", 6), ("+I", 6, "a", 3)],
    # after the restart
    [("-D", 2, "a", 25), ("-D", 6, "a", 3), ("+I", 4, "b", 8), ("-U", 1, "b", 11), ("+U", 1, "b", 12)],
    [("-D", 5, "c", 1), ("-U", 3, "c", 6), ("+U", 3, "a", 9), ("+I", 7, "d", 2)],
]
FILES = [(0, 1), (2,), (3, 4)]  # micro-batches: two before the restart, one after
KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def _table(batch_no: int, rows) -> pa.Table:
    return pa.table({
        "id": [r[1] for r in rows], "category": [r[2] for r in rows], "price": [r[3] for r in rows],
        KIND: pa.array([KINDS[r[0]] for r in rows], pa.int8()),
        SEQ: [f"b{batch_no:03d}r{i:04d}" for i in range(len(rows))]}, schema=INPUT)


def _oracle(kernel, columns) -> list[tuple]:
    out = Changes()
    for i, rows in enumerate(BATCHES):
        t = _table(i, rows)
        out.extend(kernel.process(t.select([c for c in columns] + [KIND])))
    out.extend(kernel.finish())
    return out.as_pairs()


def _per_key(pairs, key_len: int) -> dict:
    by_key = collections.defaultdict(list)
    for kind, row in pairs:
        by_key[row[:key_len]].append((kind, row))
    return dict(by_key)


def _run(spark, tmp_path, kernel_cls, config, *, keys, columns, out_schema) -> list[tuple]:
    """Feeds FILES[:2] (two micro-batches), stops, restarts from the checkpoint with FILES[2:]."""
    from pyspark.sql.types import StructType

    from changelake.changelog import RowKind

    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    spark_in = StructType.fromDDL("id BIGINT, category STRING, price BIGINT, _kind TINYINT, _seq STRING")
    emitted: list[tuple] = []

    def collect(df, batch_id):
        for r in df.collect():  # Spark's order; per-key order is what is compared
            d = r.asDict()
            emitted.append((RowKind(d.pop(KIND)).short, tuple(d[c] for c in out_schema.names)))

    def run_once(first: int, last: int):
        for i in range(first, last):  # one file per micro-batch
            write_micro_batch(pa.concat_tables(_table(j, BATCHES[j]) for j in FILES[i]), src, i)
        df = spark.readStream.schema(spark_in).option("maxFilesPerTrigger", 1).parquet(str(src))
        out = apply_kernel(df.select(*columns, KIND, SEQ), kernel_cls, config, key_columns=keys,
                           output_schema=out_schema, buckets=3)
        q = run_to_end(out, collect, ckpt)
        return q

    q1 = run_once(0, 2)
    assert len([p for p in q1.recentProgress if p["numInputRows"]]) == 2, "expected one micro-batch per file"
    run_once(2, 3)
    return emitted


def test_group_aggregate_count_sum_survives_restart(rocksdb, tmp_path):
    from pyspark.sql.types import StructType

    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"), AggCall("SUM", 1)))
    out_schema = StructType.fromDDL("category STRING, cnt BIGINT, total BIGINT")
    got = _run(rocksdb, tmp_path, GroupAggregate, config, keys=["category"],
               columns=["category", "price"], out_schema=out_schema)
    want = _oracle(GroupAggregate(config), ["category", "price"])
    assert _per_key(got, 1) == _per_key(want, 1)
    # state restored from the checkpoint: after the restart category a loses ids 2 and 6 (deleted),
    # then gains id 3; category c loses its last two rows
    assert ("-D", ("a", 1, 3)) in got and ("+I", ("a", 1, 9)) in got and ("-D", ("c", 1, 6)) in got


def test_deduplicate_keep_last_survives_restart(rocksdb, tmp_path):
    from pyspark.sql.types import StructType

    config = DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False)
    out_schema = StructType.fromDDL("id BIGINT, category STRING, price BIGINT")
    got = _run(rocksdb, tmp_path, Deduplicate, config, keys=["id"],
               columns=["id", "category", "price"], out_schema=out_schema)
    want = _oracle(Deduplicate(config), ["id", "category", "price"])
    assert _per_key(got, 1) == _per_key(want, 1)
    # id 1 was updated after the restart: the retraction carries the row stored before the restart
    assert ("-D", (1, "b", 11)) in got and ("+I", (1, "b", 12)) in got


def test_mini_batch_bundle_is_the_micro_batch():
    """Without Spark: with mini_batch_size set, a bucket's micro-batch rows fold as one bundle."""
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"), AggCall("SUM", 1)),
                                  mini_batch_size=1000)
    out_schema = pa.schema([("category", pa.string()), ("cnt", pa.int64()), ("total", pa.int64())])
    t0 = _table(0, BATCHES[0]).select(["category", "price", KIND, SEQ])
    step = run_bucket(GroupAggregate, config, None, t0, out_schema)
    out, snap = step.out, step.snapshot
    assert step.state_rows == 3
    assert Changes.from_arrow(out).as_pairs() == [("+I", ("a", 2, 30)), ("+I", ("b", 1, 5)), ("+I", ("c", 1, 7))]
    t1 = _table(1, BATCHES[1]).select(["category", "price", KIND, SEQ])
    step = run_bucket(GroupAggregate, config, snap, t1, out_schema)
    out, snap = step.out, step.snapshot
    assert sorted(Changes.from_arrow(out).as_pairs()) == sorted([
        ("-U", ("a", 2, 30)), ("+U", ("a", 1, 20)), ("-U", ("b", 1, 5)), ("+U", ("b", 2, 16)),
        ("-U", ("c", 1, 7)), ("+U", ("c", 1, 1))])
    assert snap is not None
