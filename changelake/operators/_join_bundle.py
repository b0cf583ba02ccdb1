"""The join's mini-batch bundle, columnar: pending rows as Arrow segments, the fold in numpy.

:class:`~changelake.operators.streaming_join.StreamingJoin` folds each side of a bundle per unique
key (``fold_bundle``) and then runs the surviving records one by one. Row by row the fold cost more
than the join itself (a key tuple built twice per row, a dict of lists per unique key). Here the
bundle stays columnar until the fold has decided which records survive:

* pending rows are kept per input as :class:`Segment` s: the row kinds (numpy), the key columns
  (Arrow) and the rows themselves (the Arrow batch, or the caller's row tuples), never turned into
  per-row Python tuples before the fold;
* :func:`fold_unique` computes, for a side with a unique key, exactly the groups ``fold_bundle``
  returns (same records, same order), from integer ids of the unique keys;
* only the surviving records become row tuples.

The fold, per unique key, over the kinds of its records in arrival order (``A`` = +I/+U, ``R`` =
-U/-D)::

    A after A  -> replaces it          R after A  -> both cancel
    R after R  -> replaces it          A after R  -> [R, A]
    so: the group keeps its last record if that is an A, and the last R whose previous record
    (of the same unique key) is not an A, if any; groups in first-arrival order of their join key
    (the join key of the first unique key whose group is not empty), then of their unique key.

Keys are compared as Arrow compares them (``dictionary_encode``), which is Python's equality only
for types whose equal values have one representation: integers, strings, binaries, booleans,
dates, times, timestamps, decimals (one scale per column), NULL. A float key (NaN, -0.0) or any
other type is not folded here (:func:`foldable` is False): the caller folds row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, user_columns
from changelake.operators._rows import INSERT, UPDATE_AFTER, Changes


def _exact_type(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_boolean(t) or pa.types.is_date(t) or pa.types.is_time(t)
            or pa.types.is_timestamp(t) or pa.types.is_decimal(t) or pa.types.is_null(t))


@dataclass
class Segment:
    """Consecutive pending rows of one input: ``kinds`` (int8 numpy), ``keys`` (the columns the fold
    compares, an Arrow table) and the rows: ``table`` (user columns + ``_kind``) or ``rows`` (tuples)."""
    side: str
    kinds: np.ndarray
    keys: pa.Table
    table: pa.Table | None = None
    rows: list[tuple] | None = None

    def __len__(self) -> int:
        return len(self.kinds)

    def slice(self, start: int, stop: int) -> Segment:
        return Segment(self.side, self.kinds[start:stop], self.keys.slice(start, stop - start),
                       None if self.table is None else self.table.slice(start, stop - start),
                       None if self.rows is None else self.rows[start:stop])

    def take_rows(self, idx: np.ndarray) -> list[tuple]:
        """The row tuples at ``idx`` (read from Arrow as ``Changes.from_arrow`` reads them)."""
        if self.rows is not None:
            rows = self.rows
            return [rows[i] for i in idx.tolist()]
        return Changes.from_arrow(self.table.take(pa.array(idx, pa.int64()))).rows


def key_columns(columns: Sequence[int]) -> list[int]:
    """Positions the fold compares, each once, in order."""
    return list(dict.fromkeys(columns))


def segment_of(side: str, batch: Changes | pa.Table | pa.RecordBatch, columns: Sequence[int]) -> Segment | None:
    """``batch`` as a segment keyed by the user columns at ``columns``; None when a key column's type is
    not one the fold compares exactly (or, for row tuples, when its values do not form one Arrow type)."""
    if isinstance(batch, Changes):
        try:
            keys = pa.table({f"k{i}": pa.array([r[c] for r in batch.rows]) for i, c in enumerate(columns)})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, IndexError):
            return None
        segment = Segment(side, np.asarray(batch.kinds, dtype=np.int8), keys, rows=batch.rows)
    else:
        table = pa.table(batch) if isinstance(batch, pa.RecordBatch) else batch
        if KIND not in table.column_names:
            raise ValueError(f"changelog batch has no {KIND!r} column; columns are {table.column_names}")
        names = user_columns(table)
        table = table.select([*names, KIND])
        keys = pa.table({f"k{i}": table.column(names[c]) for i, c in enumerate(columns)})
        kinds = table.column(KIND).to_numpy(zero_copy_only=False).astype(np.int8, copy=False)
        segment = Segment(side, kinds, keys, table=table)
    return segment if all(_exact_type(t) for t in segment.keys.schema.types) else None


def key_ids(keys: pa.Table, columns: Sequence[int]) -> np.ndarray:
    """Per row an int64 id, equal for rows whose ``keys`` columns at ``columns`` are equal (NULL = NULL)."""
    n = keys.num_rows
    if not columns:
        return np.zeros(n, dtype=np.int64)
    codes = []
    for c in columns:
        col = keys.column(c)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_null(arr.type):
            codes.append(np.zeros(n, dtype=np.int64))
            continue
        enc = pc.dictionary_encode(arr, null_encoding="encode")
        codes.append(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
    ids, radix = codes[0], max(int(codes[0].max(initial=0)) + 1, 1)
    for code in codes[1:]:
        width = int(code.max(initial=0)) + 1
        if radix * width >= 2**62:                     # ids would overflow: renumber what we have
            _, ids = np.unique(ids, return_inverse=True)
            radix = int(ids.max(initial=0)) + 1
            ids = ids.reshape(-1).astype(np.int64)
        ids, radix = ids * width + code, radix * width
    return ids


def concat(segments: Sequence[Segment]) -> Segment | None:
    """One side's segments as one (None for no rows); row tuples and Arrow rows are not mixed here."""
    segments = [s for s in segments if len(s)]
    if not segments:
        return None
    if len(segments) == 1:
        return segments[0]
    keys = pa.concat_tables([s.keys for s in segments], promote_options="permissive")
    kinds = np.concatenate([s.kinds for s in segments])
    if all(s.rows is not None for s in segments):
        return Segment(segments[0].side, kinds, keys, rows=[r for s in segments for r in s.rows])
    if all(s.table is not None for s in segments):
        return Segment(segments[0].side, kinds, keys,
                       table=pa.concat_tables([s.table for s in segments], promote_options="permissive"))
    rows = [r for s in segments for r in (s.rows if s.rows is not None else Changes.from_arrow(s.table).rows)]
    return Segment(segments[0].side, kinds, keys, rows=rows)


def fold_unique(kinds: np.ndarray, unique_ids: np.ndarray, join_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The surviving records of one side with a unique key: their positions in processing order, and
    per position whether it is half of a ``[R, A]`` pair; the same records in the same order as
    ``fold_bundle``'s groups."""
    n = len(kinds)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    acc = (kinds == INSERT) | (kinds == UPDATE_AFTER)
    order = np.argsort(unique_ids, kind="stable")
    s_uk, s_acc = unique_ids[order], acc[order]
    starts = np.flatnonzero(np.r_[True, s_uk[1:] != s_uk[:-1]])
    ends = np.r_[starts[1:], n] - 1
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    prev_acc = np.r_[False, s_acc[:-1]]
    candidate = ~s_acc & (first | ~prev_acc)
    slot = np.maximum.reduceat(np.where(candidate, np.arange(n), -1), starts)  # the kept R (sorted position) or -1
    last_a = np.where(s_acc[ends], ends, -1)                                     # the kept A or -1
    alive = (slot >= 0) | (last_a >= 0)
    arrival = order[starts][alive]                 # per non-empty unique key: its first record's position
    g_slot, g_last = slot[alive], last_a[alive]
    # a group's join key is that of its records (one unique key never spans two join keys)
    g_join = join_ids[order[np.where(g_slot >= 0, g_slot, g_last)]]
    # a join key's rank: the first arrival among its non-empty unique keys
    by_join = np.lexsort((arrival, g_join))
    j_sorted = g_join[by_join]
    j_starts = np.flatnonzero(np.r_[True, j_sorted[1:] != j_sorted[:-1]]) if len(j_sorted) else j_sorted
    rank = np.empty(len(arrival), dtype=np.int64)
    rank[by_join] = np.repeat(arrival[by_join][j_starts], np.diff(np.r_[j_starts, len(j_sorted)]))
    processing = np.lexsort((arrival, rank))
    pairs = np.stack([g_slot[processing], g_last[processing]], axis=1)
    both = (pairs >= 0).all(axis=1)
    flat = pairs.reshape(-1)
    keep = flat >= 0
    return order[flat[keep]], np.repeat(both, 2)[keep]
