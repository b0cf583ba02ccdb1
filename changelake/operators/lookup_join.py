"""Lookup join: each change row looks its key up in a dimension table (Flink's LookupJoinRunner).

The operator holds no state: no snapshot, nothing checkpointed, nothing to clean up. Each
input row is joined with the dimension row its key has *when the row is processed*::

    input row (kind k, key v)          dimension row for v now     emits
    ---------------------------------  --------------------------  -----------------------------
    +I / -U / +U / -D                   found                       k, stream row ++ dimension row
    +I / -U / +U / -D, inner join       absent, or v has a null     nothing
    +I / -U / +U / -D, left join        absent, or v has a null     k, stream row ++ nulls

``_kind`` and every reserved column (``_seq``) pass through unchanged. A retraction is joined
with the dimension's *current* row, as in Flink: when the dimension row changed between a
``+I`` and its ``-D``, the ``-D`` carries the new dimension values (harmless for a table keyed by
the stream's key, which deletes by key), and when the row was deleted meanwhile an inner join
drops the retraction, leaving the joined row in the table.

Per batch (:meth:`LookupJoiner.join`)::

    keys    = the batch's distinct non-null lookup keys               (Arrow group_by)
    cached  = the LookupCache's fresh entries of keys (hits)           (one hash lookup, Arrow)
    fetched = the other keys (misses) looked up in one round: batch_size keys per query, up to
              max_concurrency queries at once; keys the table lacks become "absent" entries
    cache  += fetched                                                  (LRU beyond max_rows, TTL per entry)
    emit    the batch's rows with their key's row from cached + fetched (inner: present ones only)

Only missed keys become Python objects (the sources' API takes key tuples); hits and misses
count distinct keys per batch.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.connectors.lookup import Lookup, LookupSource
from changelake.errors import ConfigError

log = logging.getLogger(__name__)

#: Column of a cache entry: whether the dimension table holds the key (False: cached as absent).
PRESENT = "__present"


def key_names(n: int) -> list[str]:
    """Names of the key columns of cache entries and key tables (the i-th lookup key column)."""
    return [f"__k{i}" for i in range(n)]


def row_names(n: int) -> list[str]:
    return [f"__c{i}" for i in range(n)]


class LookupCache:
    """The dimension rows of recently used keys, held as Arrow columns.

    An entry is a key (columns ``__k0..``), :data:`PRESENT` (False: the table lacks the key, cached
    too) and the dimension row (``__c0..``, nulls when absent). ``get`` finds a batch's distinct keys
    with one hash lookup; an entry older than ``ttl_s`` is a miss (None: no expiry). Beyond
    ``max_rows`` the least recently used entries are evicted, recency counted per ``get``/``put``
    call (one micro-batch): entries used in the same batch are equally recent. ``max_rows=0`` or
    ``ttl_s=0`` disables the cache: every key misses and ``put`` keeps nothing.
    """

    def __init__(self, entry_schema: pa.Schema, max_rows: int, ttl_s: float | None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_rows, self.ttl_s, self.clock = max_rows, ttl_s, clock
        self.enabled = max_rows > 0 and ttl_s != 0
        self.keys = [n for n in entry_schema.names if n.startswith("__k")]
        self.entries = entry_schema.empty_table()
        self._loaded = np.zeros(0, dtype=np.float64)       # clock() when each entry was read
        self._used = np.zeros(0, dtype=np.int64)           # the call that last used each entry
        self._tick = 0

    def __len__(self) -> int:
        return self.entries.num_rows

    def get(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """For distinct, non-null ``keys`` (the key columns): (the fresh entries among them, a mask
        of the keys that missed)."""
        n = keys.num_rows
        if not self.enabled or not len(self) or not n:
            return self.entries.slice(0, 0), np.ones(n, dtype=bool)
        at = pc.fill_null(_positions(keys, None, self.entries.select(self.keys)), -1).to_numpy()
        hit = at >= 0
        if self.ttl_s is not None:
            hit &= self._loaded[np.where(hit, at, 0)] > self.clock() - self.ttl_s
        self._tick += 1
        self._used[at[hit]] = self._tick
        return self.entries.take(pa.array(at[hit])), ~hit

    def put(self, entries: pa.Table) -> None:
        """Add (or replace) entries: key columns, PRESENT, row columns."""
        if not self.enabled or not entries.num_rows:
            return
        self._tick += 1
        keep = np.ones(len(self), dtype=bool)
        if len(self):
            replaced = pc.fill_null(_positions(entries.select(self.keys), None, self.entries.select(self.keys)),
                                    -1).to_numpy()
            keep[replaced[replaced >= 0]] = False
        table = pa.concat_tables([self.entries.filter(pa.array(keep)), entries.cast(self.entries.schema)])
        loaded = np.concatenate([self._loaded[keep], np.full(entries.num_rows, self.clock())])
        used = np.concatenate([self._used[keep], np.full(entries.num_rows, self._tick, dtype=np.int64)])
        if table.num_rows > self.max_rows:
            survivors = np.sort(np.argsort(used, kind="stable")[-self.max_rows:])
            table, loaded, used = table.take(pa.array(survivors)), loaded[survivors], used[survivors]
        self.entries, self._loaded, self._used = table.combine_chunks(), loaded, used


@dataclass
class LookupStats:
    """What a joiner did since the last :meth:`LookupJoiner.take_stats`: distinct keys served from the
    cache (hits) and looked up (misses), the seconds of each batched query, and the cache's size."""

    hits: int = 0
    misses: int = 0
    latencies: list[float] = field(default_factory=list)
    cache_rows: int = 0

    def merge(self, other: "LookupStats") -> "LookupStats":
        return LookupStats(self.hits + other.hits, self.misses + other.misses, self.latencies + other.latencies,
                           other.cache_rows)


@dataclass(frozen=True)
class LookupJoinConfig:
    """A lookup join node: ``stream_keys[i]`` is looked up as ``lookup.key`` column ``dim_keys[i]``;
    the output is the input's user columns, then the dimension's columns named ``dim_names``."""

    lookup: Lookup
    stream_keys: tuple[str, ...]
    dim_keys: tuple[str, ...]
    join_type: str                          # "INNER" | "LEFT"
    dim_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.join_type not in ("INNER", "LEFT"):
            raise ConfigError(f"lookup join: join type must be INNER or LEFT, got {self.join_type!r}")


class LookupJoiner:
    """Joins change batches with a dimension table through a cache; see the module docstring."""

    def __init__(self, config: LookupJoinConfig, *, source: LookupSource | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.lookup = config.lookup
        self._source = source
        dim = self.lookup.columns
        self.key_types = [dim.field(k).type for k in config.dim_keys]
        self.keys = key_names(len(config.dim_keys))
        self.rows = row_names(len(dim))
        entry = pa.schema([pa.field(n, t) for n, t in zip(self.keys, self.key_types)] + [pa.field(PRESENT, pa.bool_())]
                          + [pa.field(n, f.type) for n, f in zip(self.rows, dim)])
        self.cache = LookupCache(entry, self.lookup.cache.max_rows, self.lookup.cache.ttl_s, clock=clock)
        self._pool: ThreadPoolExecutor | None = None
        self._stats = LookupStats()
        self._warned_duplicates = False

    @property
    def source(self) -> LookupSource:
        if self._source is None:
            self._source = self.lookup.open()
        return self._source

    # -- the batch ---------------------------------------------------------------------------------
    def join(self, table: pa.Table) -> pa.Table:
        """``table`` (user columns and reserved columns) joined: the user columns, the dimension columns,
        then the reserved columns, rows in input order (inner: rows without a dimension row dropped)."""
        cfg = self.config
        user = [c for c in table.column_names if not c.startswith("_")]
        reserved = [c for c in table.column_names if c.startswith("_")]
        keys = pa.table([table[c].cast(t) for c, t in zip(cfg.stream_keys, self.key_types)], names=self.keys)
        valid = _all_valid(keys)
        distinct = keys.filter(valid).group_by(self.keys, use_threads=False).aggregate([])
        cached, missed = self.cache.get(distinct)
        fetched = self._fetch(distinct.filter(pa.array(missed)))
        self.cache.put(fetched)
        self._stats.hits += cached.num_rows
        self._stats.misses += fetched.num_rows
        self._stats.cache_rows = len(self.cache)
        known = pa.concat_tables([cached, fetched.cast(cached.schema)]) if fetched.num_rows else cached
        index = _positions(keys, valid, known.select(self.keys))
        index = pc.if_else(pc.fill_null(known[PRESENT].take(index), False), index, pa.scalar(None, index.type))
        if cfg.join_type == "INNER":
            keep = index.is_valid()
            table, index = table.filter(keep), index.filter(keep)
        picked = known.select(self.rows).take(index)
        columns = [table[c] for c in user] + list(picked.columns) + [table[c] for c in reserved]
        fields = [table.schema.field(c) for c in user] + \
                 [f.with_name(n).with_nullable(True) for f, n in zip(self.lookup.columns, cfg.dim_names)] + \
                 [table.schema.field(c) for c in reserved]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def _fetch(self, missing: pa.Table) -> pa.Table:
        """Cache entries for the ``missing`` keys: one round of lookups, ``batch_size`` keys per query."""
        dim = self.lookup.columns
        if not missing.num_rows:
            return self.cache.entries.slice(0, 0)
        wanted = list(zip(*(missing[c].to_pylist() for c in self.keys)))
        size = self.lookup.batch_size
        chunks = [wanted[i:i + size] for i in range(0, len(wanted), size)]
        source = self.source
        source.refresh()

        def one(chunk: list[tuple]) -> tuple[pa.Table, float]:
            started = time.perf_counter()
            got = source.lookup(chunk)
            return got, time.perf_counter() - started

        if len(chunks) == 1 or self.lookup.max_concurrency == 1:
            results = [one(c) for c in chunks]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.lookup.max_concurrency,
                                                thread_name_prefix=f"lookup-{self.lookup.name}")
            results = list(self._pool.map(one, chunks))
        self._stats.latencies.extend(seconds for _, seconds in results)
        found = pa.concat_tables([got.cast(dim) for got, _ in results])
        found_keys = pa.table([found[k] for k in self.config.dim_keys], names=self.keys)
        if not self._warned_duplicates and found.num_rows and \
                found_keys.group_by(self.keys, use_threads=False).aggregate([]).num_rows < found.num_rows:
            self._warned_duplicates = True
            log.warning("lookup %s: the dimension table holds several rows for some key; the key must identify "
                        "one row: the join uses one of them", self.lookup.name)
        at = _positions(missing, None, found_keys)
        rows = found.take(at)
        return pa.Table.from_arrays([*missing.columns, at.is_valid(), *rows.columns],
                                    names=[*self.keys, PRESENT, *self.rows])

    # -- reporting and cleanup -------------------------------------------------------------------------
    def take_stats(self) -> LookupStats:
        """The counts since the last call (and the cache's current size)."""
        stats, self._stats = self._stats, LookupStats(cache_rows=len(self.cache))
        stats.cache_rows = len(self.cache)
        return stats

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._source is not None:
            self._source.close()
            self._source = None


def _all_valid(keys: pa.Table) -> pa.Array:
    mask = None
    for column in keys.columns:
        v = column.is_valid()
        mask = v if mask is None else pc.and_(mask, v)
    return mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask


def _positions(keys: pa.Table, valid: pa.Array | None, known: pa.Table) -> pa.Array:
    """Per row of ``keys``, the position of its key among the rows of ``known`` (same key columns, by
    position; the first match), null where absent or where ``valid`` is false."""
    n = keys.num_rows
    if keys.num_columns == 1:
        found = pc.index_in(keys.column(0).combine_chunks(), value_set=known.column(0).combine_chunks())
        return found if valid is None else pc.if_else(valid, found, pa.scalar(None, pa.int32()))
    names = [f"k{i}" for i in range(keys.num_columns)]
    left = pa.table(list(keys.columns) + [pa.array(np.arange(n, dtype=np.int64))], names=[*names, "row"])
    right = pa.table(list(known.columns) + [pa.array(np.arange(known.num_rows, dtype=np.int32))],
                     names=[*names, "at"])
    if valid is not None:
        left = left.filter(valid)
    if right.num_rows:
        first = right.group_by(names, use_threads=False).aggregate([("at", "min")])
        right = pa.table([*(first[k] for k in names), first["at_min"]], names=[*names, "at"])
    matched = left.join(right, keys=names, join_type="inner", use_threads=False)
    out = np.full(n, -1, dtype=np.int32)
    out[matched["row"].to_numpy()] = matched["at"].to_numpy()
    return pa.array(out, mask=out < 0)


def observe(lookup: str, stats: LookupStats) -> None:
    """Add ``stats`` to this process's Prometheus registry (the driver's, for the Spark executor)."""
    from changelake import metrics

    metrics.LOOKUP_REQUESTS.labels(lookup=lookup, result="hit").inc(stats.hits)
    metrics.LOOKUP_REQUESTS.labels(lookup=lookup, result="miss").inc(stats.misses)
    for seconds in stats.latencies:
        metrics.LOOKUP_LATENCY.labels(lookup=lookup).observe(seconds)
    metrics.LOOKUP_CACHE_ROWS.labels(lookup=lookup).set(stats.cache_rows)
