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

Per batch (:meth:`LookupJoiner.join`): the distinct non-null keys of the batch are served from
the :class:`LookupCache` where it holds them (hits); the others (misses) are looked up in one
round, ``batch_size`` keys per query and up to ``max_concurrency`` queries at once, and cached
(keys the table lacks are cached as absent). Hits and misses count distinct keys per batch.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.connectors.lookup import Lookup, LookupSource
from changelake.errors import ConfigError

log = logging.getLogger(__name__)

#: Cache value of a key the dimension table does not hold.
ABSENT = None


class LookupCache:
    """Key -> dimension row (a tuple) or :data:`ABSENT`; least recently used evicted beyond
    ``max_rows``; an entry older than ``ttl_s`` is a miss (None: no expiry). ``max_rows=0`` or
    ``ttl_s=0`` disables it: every ``get`` misses and ``put`` keeps nothing."""

    def __init__(self, max_rows: int, ttl_s: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_rows, self.ttl_s, self.clock = max_rows, ttl_s, clock
        self.enabled = max_rows > 0 and ttl_s != 0
        self._entries: collections.OrderedDict[tuple, tuple[float, Any]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, keys: list[tuple]) -> tuple[dict[tuple, Any], list[tuple]]:
        """(the cached rows of ``keys`` by key, the keys not cached or expired)."""
        if not self.enabled:
            return {}, list(keys)
        now = self.clock()
        hits: dict[tuple, Any] = {}
        misses: list[tuple] = []
        entries = self._entries
        for k in keys:
            entry = entries.get(k)
            if entry is None or (self.ttl_s is not None and now - entry[0] >= self.ttl_s):
                misses.append(k)
            else:
                entries.move_to_end(k)
                hits[k] = entry[1]
        return hits, misses

    def put(self, rows: dict[tuple, Any]) -> None:
        if not self.enabled:
            return
        now = self.clock()
        entries = self._entries
        for k, row in rows.items():
            entries[k] = (now, row)
            entries.move_to_end(k)
        while len(entries) > self.max_rows:
            entries.popitem(last=False)


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
        self.cache = LookupCache(self.lookup.cache.max_rows, self.lookup.cache.ttl_s, clock=clock)
        # the dimension key columns in the order of the stream's key (the lookup's rows are keyed so)
        self._key_pos = tuple(self.lookup.columns.names.index(k) for k in config.dim_keys)
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
        key_types = [self.lookup.columns.field(k).type for k in cfg.dim_keys]
        keys = pa.table([table[c].cast(t) for c, t in zip(cfg.stream_keys, key_types)],
                        names=[f"k{i}" for i in range(len(key_types))])
        valid = _all_valid(keys)
        distinct = keys.filter(valid).group_by(keys.column_names, use_threads=False).aggregate([])
        wanted = list(zip(*(distinct[c].to_pylist() for c in distinct.column_names)))
        rows = self._rows(wanted)
        found = [k for k in wanted if rows.get(k) is not None]
        dim = pa.Table.from_arrays(
            [pa.array([rows[k][i] for k in found], f.type) for i, f in enumerate(self.lookup.columns)],
            schema=self.lookup.columns)
        index = _positions(keys, valid, dim.select(list(cfg.dim_keys)))
        if cfg.join_type == "INNER":
            keep = index.is_valid()
            table, index = table.filter(keep), index.filter(keep)
        picked = dim.take(index)
        columns = [table[c] for c in user] + list(picked.columns) + [table[c] for c in reserved]
        fields = [table.schema.field(c) for c in user] + \
                 [f.with_name(n).with_nullable(True) for f, n in zip(self.lookup.columns, cfg.dim_names)] + \
                 [table.schema.field(c) for c in reserved]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def _rows(self, keys: list[tuple]) -> dict[tuple, Any]:
        """Each key's dimension row (or ABSENT): cache hits, then one round of lookups for the misses."""
        hits, misses = self.cache.get(keys)
        self._stats.hits += len(hits)
        self._stats.misses += len(misses)
        if misses:
            fetched = self._fetch(misses)
            self.cache.put(fetched)
            hits.update(fetched)
        self._stats.cache_rows = len(self.cache)
        return hits

    def _fetch(self, keys: list[tuple]) -> dict[tuple, Any]:
        size = self.lookup.batch_size
        chunks = [keys[i:i + size] for i in range(0, len(keys), size)]
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
        out: dict[tuple, Any] = dict.fromkeys(keys, ABSENT)
        for got, seconds in results:
            self._stats.latencies.append(seconds)
            for row in zip(*(got[c].to_pylist() for c in got.column_names)):
                key = tuple(row[i] for i in self._key_pos)
                if out.get(key) is not None and not self._warned_duplicates:
                    self._warned_duplicates = True
                    log.warning("lookup %s: the dimension table holds several rows for key %r (and maybe others); "
                                "the key must identify one row: the join uses the last one read",
                                self.lookup.name, key)
                if key in out:
                    out[key] = row
        return out

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


def _positions(keys: pa.Table, valid: pa.Array, dim_keys: pa.Table) -> pa.Array:
    """Per input row, the position of its key among ``dim_keys`` (unique keys), null if absent."""
    n = keys.num_rows
    if keys.num_columns == 1:
        found = pc.index_in(keys.column(0).combine_chunks(), value_set=dim_keys.column(0).combine_chunks())
        return pc.if_else(valid, found, pa.scalar(None, pa.int32()))
    left = pa.table(list(keys.columns) + [pa.array(np.arange(n, dtype=np.int64))],
                    names=[*keys.column_names, "row"])
    right = pa.table(list(dim_keys.columns) + [pa.array(np.arange(dim_keys.num_rows, dtype=np.int32))],
                     names=[*keys.column_names, "at"])
    matched = left.filter(valid).join(right, keys=keys.column_names, join_type="inner", use_threads=False)
    out = np.full(n, -1, dtype=np.int32)
    out[matched["row"].to_numpy()] = matched["at"].to_numpy()
    return pa.array(out, mask=out < 0)


def observe(lookup: str, stats: LookupStats) -> None:
    """Add ``stats`` to this process's Prometheus registry (the driver's, for the Spark executor)."""
    from changelake.service import metrics

    metrics.LOOKUP_REQUESTS.labels(lookup=lookup, result="hit").inc(stats.hits)
    metrics.LOOKUP_REQUESTS.labels(lookup=lookup, result="miss").inc(stats.misses)
    for seconds in stats.latencies:
        metrics.LOOKUP_LATENCY.labels(lookup=lookup).observe(seconds)
    metrics.LOOKUP_CACHE_ROWS.labels(lookup=lookup).set(stats.cache_rows)


class SparkLookupStats:
    """Lookup figures carried from the Python workers to the driver through a Spark accumulator.

    Each task of a lookup join adds its joiner's :class:`LookupStats` under (lookup, worker pid);
    the driver drains the accumulator after each micro-batch (:meth:`drain`): it adds hits,
    misses and latencies to its registry and keeps each worker's latest cache size, whose sum is
    ``changelake_lookup_cache_rows``.
    """

    def __init__(self) -> None:
        self.cache_rows: dict[tuple[str, int], int] = {}

    @staticmethod
    def accumulator(spark: Any) -> Any:
        from pyspark.accumulators import AccumulatorParam

        class Merge(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, a: dict, b: dict) -> dict:
                for k, s in b.items():
                    a[k] = a[k].merge(s) if k in a else s
                return a

        return spark.sparkContext.accumulator({}, Merge())

    @staticmethod
    def report(accumulator: Any, lookup: str, stats: LookupStats) -> None:
        """In a task: add a joiner's figures."""
        accumulator.add({(lookup, os.getpid()): stats})

    def drain(self, accumulator: Any) -> dict[str, LookupStats]:
        """On the driver, after a batch: the figures per lookup since the last drain (observed into the
        registry), with the cache rows summed over workers."""
        value, accumulator.value = accumulator.value, {}
        out: dict[str, LookupStats] = {}
        for (lookup, pid), stats in value.items():
            self.cache_rows[(lookup, pid)] = stats.cache_rows
            out[lookup] = out[lookup].merge(stats) if lookup in out else LookupStats().merge(stats)
        for lookup, stats in out.items():
            stats.cache_rows = sum(r for (name, _), r in self.cache_rows.items() if name == lookup)
            observe(lookup, stats)
        return out
