"""Vectorised mini-batch fold for GroupAggregate: a bundle's rows summed per group with NumPy.

Used when every aggregate is COUNT(*), COUNT(col), or SUM/AVG over an integer column (exact
integer sums, so the result equals applying the rows one by one). Per group it yields the
deltas of the whole bundle and of the group's leading retractions (rows before its first
accumulate message), which are dropped for a group that has no state yet.

A value is summed as two int64 halves, ``v >> 32`` and ``v & 0xFFFFFFFF``, each far from
overflowing for any bundle of fewer than 2^31 rows; :func:`partial` joins them into a Python
int. (Summing BIGINT values in int64 directly wraps around silently at 2^63.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, user_columns
from changelake.operators._values import canonical_column
from changelake.operators.aggregates import Avg, Count, Sum


@dataclass
class GroupDeltas:
    keys: list[tuple]          # group key per group, in order of first arrival
    rows: np.ndarray           # rows per group
    leading: np.ndarray        # leading retractions per group
    all_deltas: np.ndarray     # [group, 1 + 3 * n_calls]: record count, then (value >> 32, value & 0xFFFFFFFF,
    #                            count) per call: the value's high and low halves
    lead_deltas: np.ndarray    # the same over the leading retractions only
    first: np.ndarray          # position of each group's first row in the bundle


def partial(functions, deltas: np.ndarray) -> list:
    """A row of deltas as a partial accumulator ``[record_count, [acc per call]]`` (what
    :meth:`_Aggs.merge` takes): COUNT's accumulator is the count, SUM/AVG's ``[sum, count]``."""
    accs = []
    for i, fn in enumerate(functions):
        high, low, count = (int(d) for d in deltas[1 + 3 * i:4 + 3 * i])
        value = (high << 32) + low
        accs.append(value if isinstance(fn, Count) else [value, count])
    return [int(deltas[0]), accs]


def vectorisable(calls, functions, schema: pa.Schema | None) -> bool:
    """True if every call is COUNT, or SUM/AVG of an integer column, without DISTINCT."""
    for call, fn in zip(calls, functions):
        if call.distinct or type(fn) not in (Count, Sum, Avg):
            return False
        if type(fn) is not Count and schema is not None:
            names = [n for n in schema.names if not n.startswith("_")]
            if not pa.types.is_integer(schema.field(names[call.column]).type):
                return False
    return True


def group_ids(bundle: pa.Table, keys: list[str]) -> np.ndarray:
    """Per row of ``bundle``, the number of its group by the ``keys`` columns, groups numbered in order
    of their first row (NULL is a group of its own). Arrow groups the values as they are: a
    pandas groupby would turn a BIGINT key column with a NULL into float64, where 2^63-1 and
    2^63-2 are one value. Arrow tells -0.0 from 0.0 and NaNs by their bits, SQL (and the row path)
    does not: a floating key's zeros, and its NaNs, are made one before grouping."""
    n = bundle.num_rows
    if not keys or not n:                   # a global aggregate: one group
        return np.zeros(n, dtype=np.int64)
    pos = "__changelake_pos"
    columns = {k: _sql_equal(bundle.column(k)) for k in keys}
    grouped = pa.table({**columns, pos: pa.array(np.arange(n, dtype=np.int64))}) \
        .group_by(keys, use_threads=False).aggregate([(pos, "min"), (pos, "list")])
    rank = np.empty(grouped.num_rows, dtype=np.int64)
    rank[np.argsort(grouped[f"{pos}_min"].to_numpy())] = np.arange(grouped.num_rows)
    rows = grouped[f"{pos}_list"].combine_chunks()
    gid = np.empty(n, dtype=np.int64)
    gid[pc.list_flatten(rows).to_numpy()] = np.repeat(rank, pc.list_value_length(rows).to_numpy())
    return gid


def _sql_equal(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A floating column with -0.0 as 0.0 and every NaN as one NaN (values SQL calls equal)."""
    if not pa.types.is_floating(column.type):
        return column
    column = pc.if_else(pc.equal(column, 0), pa.scalar(0, column.type), column)
    return pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), column.type), column)


def fold(bundle: pa.Table, group_keys: tuple[int, ...], calls) -> GroupDeltas:
    names = user_columns(bundle)
    keys = [names[i] for i in group_keys]
    kinds = bundle.column(KIND).to_numpy()
    sign = np.where((kinds == 0) | (kinds == 2), 1, -1).astype(np.int64)
    gid = group_ids(bundle, keys)
    n_groups = int(gid.max()) + 1 if len(gid) else 0
    leading = (pd.Series(sign > 0).groupby(gid).cumsum().to_numpy() == 0)

    columns = [sign]
    zeros = np.zeros_like(sign)
    for call in calls:
        if call.column is None:
            columns += [zeros, sign, zeros]
            continue
        col = bundle.column(names[call.column])
        valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
        counted = np.where(valid, sign, 0)
        if isinstance(call.resolve(), Count):
            columns += [zeros, counted, zeros]
        else:
            values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            columns += [(values >> 32) * counted, (values & 0xFFFFFFFF) * counted, counted]
    contrib = np.stack(columns, axis=1)
    all_deltas = np.zeros((n_groups, contrib.shape[1]), dtype=np.int64)
    lead_deltas = np.zeros_like(all_deltas)
    np.add.at(all_deltas, gid, contrib)
    np.add.at(lead_deltas, gid[leading], contrib[leading])
    _, first_pos = np.unique(gid, return_index=True)
    key_table = bundle.select(keys).take(pa.array(first_pos))
    key_columns = [canonical_column(c, c.to_pylist()) for c in key_table.columns]
    return GroupDeltas(
        keys=list(zip(*key_columns)) if keys else [()] * n_groups,
        rows=np.bincount(gid, minlength=n_groups),
        leading=np.bincount(gid[leading], minlength=n_groups),
        all_deltas=all_deltas, lead_deltas=lead_deltas, first=first_pos)
