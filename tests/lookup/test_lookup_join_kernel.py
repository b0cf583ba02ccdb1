"""The lookup cache and joiner without a database: LRU eviction, TTL expiry on an injected
clock, negative caching, batched and concurrent lookups, and the emission rules."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ
from changelake.connectors.lookup import CacheOptions, Lookup, LookupSource
from changelake.errors import ConfigError
from changelake.operators.lookup_join import PRESENT, LookupCache, LookupJoinConfig, LookupJoiner

pytestmark = pytest.mark.unit

DIM = {"id": "bigint", "category": "string"}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeSource(LookupSource):
    """A dimension in memory that records every query (and how many ran at once)."""

    def __init__(self, spec: Lookup, rows: dict[tuple, tuple], delay: float = 0.0) -> None:
        super().__init__(spec)
        self.rows, self.delay = rows, delay
        self.queries: list[list[tuple]] = []
        self.refreshes = 0
        self.running = self.peak = 0
        self.lock = threading.Lock()

    def refresh(self) -> None:
        self.refreshes += 1

    def lookup(self, keys: list[tuple]) -> pa.Table:
        with self.lock:
            self.queries.append(list(keys))
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
        found = [self.rows[k] for k in keys if k in self.rows]
        return pa.Table.from_pylist([dict(zip(self.spec.columns.names, r)) for r in found], schema=self.spec.columns)


def spec(**kw) -> Lookup:
    kw.setdefault("cache", CacheOptions(max_rows=100, ttl="10 s"))
    return Lookup.delta("products", "/nowhere", columns=kw.pop("columns", DIM), key=kw.pop("key", ["id"]), **kw)


def joiner(lookup: Lookup, rows: dict, *, how: str = "INNER", stream_keys=("product_id",), dim_names=None,
           clock=None, delay: float = 0.0) -> tuple[LookupJoiner, FakeSource]:
    source = FakeSource(lookup, rows, delay)
    config = LookupJoinConfig(lookup, tuple(stream_keys), lookup.key, how,
                              tuple(dim_names or lookup.columns.names))
    return LookupJoiner(config, source=source, clock=clock or Clock()), source


def orders(rows: list[tuple]) -> pa.Table:
    """(kind, order_id, product_id) rows with a _seq."""
    return pa.table({"order_id": pa.array([r[1] for r in rows], pa.int64()),
                     "product_id": pa.array([r[2] for r in rows], pa.int64()),
                     KIND: pa.array([r[0] for r in rows], pa.int8()),
                     SEQ: pa.array([f"s{i}" for i in range(len(rows))])})


# --- the cache -------------------------------------------------------------------------------------
ENTRY = pa.schema([("__k0", pa.int64()), (PRESENT, pa.bool_()), ("__c0", pa.string())])


def entries(rows: dict[int, str | None]) -> pa.Table:
    return pa.table({"__k0": pa.array(list(rows), pa.int64()), PRESENT: [v is not None for v in rows.values()],
                     "__c0": list(rows.values())}, schema=ENTRY)


def get(cache: LookupCache, *keys: int) -> tuple[dict, list]:
    """(hits: key -> row or None when cached as absent, missed keys)."""
    found, missed = cache.get(pa.table({"__k0": pa.array(keys, pa.int64())}))
    hits = {r["__k0"]: r["__c0"] if r[PRESENT] else None for r in found.to_pylist()}
    return hits, [k for k, m in zip(keys, missed) if m]


def test_cache_evicts_the_least_recently_used_key():
    cache = LookupCache(ENTRY, 2, None)
    cache.put(entries({1: "a", 2: "b"}))
    assert get(cache, 1) == ({1: "a"}, [])                     # 1 is now the most recently used
    cache.put(entries({3: "c"}))
    assert get(cache, 1, 2, 3) == ({1: "a", 3: "c"}, [2])
    assert len(cache) == 2


def test_cache_entries_expire_after_the_ttl():
    clock = Clock()
    cache = LookupCache(ENTRY, 10, 5.0, clock=clock)
    cache.put(entries({1: "a"}))
    clock.t = 4.9
    assert get(cache, 1) == ({1: "a"}, [])
    clock.t = 5.0
    assert get(cache, 1) == ({}, [1])
    cache.put(entries({1: "a2"}))                              # a re-read replaces the entry, its life restarts
    clock.t = 9.0
    assert get(cache, 1) == ({1: "a2"}, []) and len(cache) == 1


def test_cache_keeps_missing_keys_as_absent():
    cache = LookupCache(ENTRY, 10, None)
    cache.put(entries({7: None}))
    assert get(cache, 7) == ({7: None}, [])


@pytest.mark.parametrize("max_rows, ttl", [(0, "1 minute"), (10, "0 s")])
def test_a_zero_size_or_ttl_turns_the_cache_off(max_rows, ttl):
    options = CacheOptions(max_rows=max_rows, ttl=ttl)
    assert not options.enabled and options.describe() == "off"
    cache = LookupCache(ENTRY, options.max_rows, options.ttl_s)
    cache.put(entries({1: "a"}))
    assert get(cache, 1) == ({}, [1]) and len(cache) == 0


def test_cache_options_are_checked():
    with pytest.raises(ConfigError, match="max_rows"):
        CacheOptions(max_rows=-1)
    with pytest.raises(ConfigError, match="ttl"):
        CacheOptions(ttl="soon")


# --- batching and concurrency ---------------------------------------------------------------------------
def test_missing_keys_are_looked_up_in_batches_of_batch_size_concurrently():
    lookup = spec(batch_size=10, max_concurrency=4)
    rows = {(i,): (i, f"c{i % 3}") for i in range(0, 100, 2)}           # even ids exist
    j, source = joiner(lookup, rows, delay=0.05)
    out = j.join(orders([(0, 1000 + i, i % 45) for i in range(200)]))    # 45 distinct keys, many rows each
    assert [len(q) for q in source.queries].count(10) == 4 and sorted(len(q) for q in source.queries)[0] == 5
    assert sorted(k for q in source.queries for k in q) == [(i,) for i in range(45)]   # each key once
    assert source.peak > 1 and source.peak <= 4
    assert source.refreshes == 1                                          # one round per batch
    stats = j.take_stats()
    assert (stats.hits, stats.misses, len(stats.latencies), stats.cache_rows) == (0, 45, 5, 45)
    assert out.num_rows == sum(1 for i in range(200) if (i % 45) % 2 == 0)

    # the next batch is served from the cache, missing keys included
    j.join(orders([(0, 1, i) for i in range(45)]))
    assert len(source.queries) == 5 and source.refreshes == 1
    stats = j.take_stats()
    assert (stats.hits, stats.misses, stats.latencies) == (45, 0, [])
    j.close()


def test_expired_keys_are_looked_up_again():
    clock = Clock()
    j, source = joiner(spec(), {(1,): (1, "a")}, clock=clock)
    j.join(orders([(0, 1, 1), (0, 2, 2)]))
    clock.t = 11
    source.rows[(1,)] = (1, "b")                        # the dimension changed
    source.rows[(2,)] = (2, "new")                      # and gained a key that was missing
    out = j.join(orders([(2, 1, 1), (0, 2, 2)]))
    assert out["category"].to_pylist() == ["b", "new"]
    assert len(source.queries) == 2


# --- emission rules ------------------------------------------------------------------------------------
def test_inner_keeps_kind_and_seq_and_drops_rows_without_a_dimension_row():
    j, _ = joiner(spec(), {(1,): (1, "a"), (2,): (2, "b")})
    out = j.join(orders([(0, 10, 1), (1, 11, 3), (2, 11, 2), (3, 12, None), (3, 13, 1)]))
    assert out.column_names == ["order_id", "product_id", "id", "category", KIND, SEQ]
    assert out.to_pylist() == [
        {"order_id": 10, "product_id": 1, "id": 1, "category": "a", KIND: 0, SEQ: "s0"},
        {"order_id": 11, "product_id": 2, "id": 2, "category": "b", KIND: 2, SEQ: "s2"},
        {"order_id": 13, "product_id": 1, "id": 1, "category": "a", KIND: 3, SEQ: "s4"}]


def test_left_pads_missing_and_null_keys_with_nulls():
    j, source = joiner(spec(), {(1,): (1, "a")}, how="LEFT")
    out = j.join(orders([(0, 10, 1), (0, 11, 3), (0, 12, None)]))
    assert out.select(["order_id", "id", "category", KIND]).to_pylist() == [
        {"order_id": 10, "id": 1, "category": "a", KIND: 0},
        {"order_id": 11, "id": None, "category": None, KIND: 0},
        {"order_id": 12, "id": None, "category": None, KIND: 0}]
    assert source.queries == [[(1,), (3,)]]             # a null key is never looked up


def test_composite_keys_and_renamed_columns():
    dim = {"region": "string", "code": "int", "name": "string"}
    lookup = spec(columns=dim, key=["region", "code"])
    j, _ = joiner(lookup, {("eu", 1): ("eu", 1, "Paris"), ("us", 1): ("us", 1, "Boston")},
                  stream_keys=("r", "c"), dim_names=("region", "code", "shops_name"))
    stream = pa.table({"name": ["x", "y", "z"], "r": ["us", "eu", "eu"], "c": pa.array([1, 1, 2], pa.int32()),
                       KIND: pa.array([0, 0, 0], pa.int8())})
    out = j.join(stream)
    assert out.select(["name", "shops_name"]).to_pylist() == [{"name": "x", "shops_name": "Boston"},
                                                               {"name": "y", "shops_name": "Paris"}]


def test_an_empty_batch_queries_nothing():
    j, source = joiner(spec(), {})
    out = j.join(orders([]))
    assert out.num_rows == 0 and source.queries == [] and source.refreshes == 0
