"""A Python worker reuses the kernel it left a bucket in only while the stored state is what it wrote.

``step_bucket`` keeps, per worker, the kernel of each (node, bucket) it last ran, with the snapshot it
stored; the next step of that bucket runs that kernel instead of restoring one when the stored snapshot
is byte for byte the one it left. Whatever else is stored (another worker's step, the state before a
replayed micro-batch, a restart's checkpoint), the kernel is restored from the state, and the output
and the stored snapshot are those of a restore, byte for byte.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ
from changelake.operators import AggCall, GroupAggregate, GroupAggregateConfig
from changelake.operators.join_state import InputSpec
from changelake.operators.streaming_join import StreamingJoin, StreamingJoinConfig
from changelake.spark.binding import (
    KERNEL_CACHE_ROWS,
    KernelCache,
    NodeInfo,
    cache_rows,
    run_bucket,
    step_bucket,
)
from changelake.spark.payloads import to_ipc

pytestmark = pytest.mark.unit

ORDERS = pa.schema([("order_id", pa.int64()), ("product_id", pa.int64()), ("qty", pa.int32()),
                    (KIND, pa.int8()), (SEQ, pa.string())])
PRODUCTS = pa.schema([("id", pa.int64()), ("category", pa.string()), ("price", pa.int64()),
                      (KIND, pa.int8()), (SEQ, pa.string())])
OUT = pa.schema([("order_id", pa.int64()), ("product_id", pa.int64()), ("qty", pa.int32()),
                 ("id", pa.int64()), ("category", pa.string()), ("price", pa.int64())])
#: bench (b)'s join: orders (unique order_id) JOIN products (unique id) ON product_id = id, mini-batch
JOIN = StreamingJoinConfig(join_type="INNER", left_key=(1,), right_key=(0,), left_arity=3, right_arity=3,
                           left_input=InputSpec("has_unique_key", (0,)),
                           right_input=InputSpec("join_key_contains_unique_key", (0,)), mini_batch_size=1)
INFO = NodeInfo("enriched")
KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


class Stored:
    """A bucket's ``kernel-snapshot`` value as the processor sees it (``get``/``update``/``clear``)."""

    def __init__(self, value: bytes | None = None) -> None:
        self.value = value

    def get(self):
        return None if self.value is None else (self.value,)

    def update(self, row) -> None:
        self.value = row[0]

    def clear(self) -> None:
        self.value = None


def _table(schema, records, start):
    cols = list(zip(*[r for _, r in records])) if records else [[] for _ in schema.names[:3]]
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, schema)]
    arrays += [pa.array([KINDS[k] for k, _ in records], pa.int8()),
               pa.array([f"{start + i:012d}" for i in range(len(records))], pa.string())]
    return pa.table(arrays, schema=schema)


BATCHES = [  # (orders, products) per micro-batch
    ([("+I", (1, 10, 1)), ("+I", (2, 10, 2)), ("+I", (3, 20, 1))],
     [("+I", (10, "tools", 5)), ("+I", (20, "toys", 7))]),
    ([("-U", (1, 10, 1)), ("+U", (1, 10, 4)), ("-D", (2, 10, 2)), ("+I", (4, 20, 9))],
     [("-U", (20, "toys", 7)), ("+U", (20, "garden", 8))]),
    ([("-U", (3, 20, 1)), ("+U", (3, 10, 1)), ("+I", (5, 30, 1))],
     [("-D", (10, "tools", 5)), ("+I", (30, "books", 3))]),
]


def _envelopes(batch: int):
    orders, products = BATCHES[batch]
    return [(0, to_ipc(_table(ORDERS, orders, 100 * batch))), (1, to_ipc(_table(PRODUCTS, products, 100 * batch)))]


def _step(state, batch, cache, now=None):
    return step_bucket(state, StreamingJoin, JOIN, [ORDERS, PRODUCTS], _envelopes(batch), OUT, INFO, 3,
                       now=batch if now is None else now, event_time=False, cache=cache)


def _restored(snapshot, batch):
    """The step as a worker without a cached kernel runs it: restored from ``snapshot``."""
    orders, products = BATCHES[batch]
    return run_bucket(StreamingJoin, JOIN, snapshot,
                      [_table(ORDERS, orders, 100 * batch), _table(PRODUCTS, products, 100 * batch)], OUT, now=batch)


def test_a_worker_reuses_its_kernel_and_stores_what_a_restore_would():
    cache, state = KernelCache(1000), Stored()
    snapshots = [None]
    for batch in range(3):
        want = _restored(snapshots[-1], batch)
        out, _ = _step(state, batch, cache)
        assert out.equals(want.out)
        assert state.value == want.snapshot            # the checkpoint holds the same bytes as before
        snapshots.append(state.value)
        assert len(cache) == 1
    # the kernel in the cache is the one the steps went on with, not a fresh restore each time
    kernel = cache.take(("enriched", 3), StreamingJoin, JOIN, state.value)
    assert kernel is not None and kernel.state_rows == _restored(snapshots[2], 2).state_rows


def test_a_replayed_micro_batch_restores_from_the_stored_state_not_the_cached_kernel():
    cache, state = KernelCache(1000), Stored()
    _step(state, 0, cache)
    before = state.value
    first, _ = _step(state, 1, cache)             # the worker caches the kernel after batch 1 ...
    state.value = before                           # ... the batch is replayed from the state before it
    again, _ = _step(state, 1, cache)
    assert again.equals(first)                     # the cached kernel would retract order 2 twice and so on
    assert state.value == _restored(before, 1).snapshot


def test_another_workers_step_of_the_bucket_is_not_missed():
    mine, other, state = KernelCache(1000), KernelCache(1000), Stored()
    _step(state, 0, mine)
    _step(state, 1, other)                         # batch 1 of the bucket ran in another Python worker
    out, _ = _step(state, 2, mine)                 # mine still holds the kernel after batch 0
    want = _restored(_restored(_restored(None, 0).snapshot, 1).snapshot, 2)
    assert out.equals(want.out) and state.value == want.snapshot


def test_a_restarted_worker_restores_from_the_checkpoint():
    state = Stored()
    _step(state, 0, KernelCache(1000))
    _step(state, 1, KernelCache(1000))             # a new worker (a restart): nothing cached
    out, _ = _step(state, 2, KernelCache(1000))
    want = _restored(_restored(_restored(None, 0).snapshot, 1).snapshot, 2)
    assert out.equals(want.out) and state.value == want.snapshot


def test_a_kernel_that_raises_is_dropped_and_the_rows_are_isolated_from_the_stored_state():
    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 1),))
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), (KIND, pa.int8()), (SEQ, pa.string())])
    out_schema = pa.schema([("k", pa.string()), ("total", pa.int64())])
    cache, state = KernelCache(1000), Stored()

    def step(rows, start):
        env = [(0, to_ipc(pa.table([pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows], pa.int64()),
                                    pa.array([0] * len(rows), pa.int8()),
                                    pa.array([f"{start + i:012d}" for i in range(len(rows))])], schema=schema)))]
        return step_bucket(state, GroupAggregate, config, [schema], env, out_schema, NodeInfo("agg"), 0, now=0,
                           event_time=False, cache=cache)

    step([("a", 2**63 - 2), ("b", 1)], 0)
    # "b" is added to before "a" overflows: the cached kernel is half-changed when it raises
    _, sent = step([("b", 5), ("a", 1), ("a", 1)], 10)
    assert [r.seq for r in sent if type(r).__name__ == "Rejected"] == ["000000000012"]
    out, _ = step([("b", 1)], 20)
    assert out.to_pydict()["total"][-1] == 7       # b: 1 + 5 + 1, the 5 counted once


def test_the_cache_is_bounded_and_checks_class_and_config():
    cache = KernelCache(10)
    cache.put(("n", 0), StreamingJoin, JOIN, b"s0", "k0", 6)
    cache.put(("n", 1), StreamingJoin, JOIN, b"s1", "k1", 6)     # over the bound: bucket 0 goes
    assert len(cache) == 1 and cache.take(("n", 0), StreamingJoin, JOIN, b"s0") is None
    assert cache.take(("n", 1), StreamingJoin, JOIN, b"s1") == "k1"
    cache.put(("n", 1), StreamingJoin, JOIN, b"s1", "k1", 6)
    assert cache.take(("n", 1), StreamingJoin, JOIN.__class__(**{**JOIN.__dict__, "join_type": "LEFT"}), b"s1") is None
    cache.put(("n", 1), StreamingJoin, JOIN, b"s1", "k1", 6)
    assert cache.take(("n", 1), GroupAggregate, JOIN, b"s1") is None
    cache.put(("n", 2), StreamingJoin, JOIN, b"s2", "big", 11)    # larger than the bound: not held
    assert len(cache) == 0


def test_the_bound_is_a_third_of_a_capped_python_workers_memory():
    assert cache_rows({}) == KERNEL_CACHE_ROWS == 0            # off unless asked for (measured slower on 2 cores)
    on = {"CHANGELAKE_KERNEL_CACHE_ROWS": "500000"}
    assert cache_rows(on) == 500_000
    assert cache_rows({**on, "PYSPARK_EXECUTOR_MEMORY_MB": "1024"}) == 1024 * 1024 * 1024 // 3 // 1024
    assert cache_rows({**on, "PYSPARK_EXECUTOR_MEMORY_MB": "1000000"}) == 500_000
