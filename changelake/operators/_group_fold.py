"""Vectorised mini-batch fold for GroupAggregate: a bundle's rows summed per group with NumPy.

Used when every aggregate is COUNT(*), COUNT(col), or SUM/AVG over an integer column (exact
integer sums, so the result equals applying the rows one by one). Per group it yields the
deltas of the whole bundle and of the group's leading retractions (rows before its first
accumulate message), which are dropped for a group that has no state yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, user_columns
from changelake.operators.aggregates import Avg, Count, Sum


@dataclass
class GroupDeltas:
    keys: list[tuple]          # group key per group, in order of first arrival
    rows: np.ndarray           # rows per group
    leading: np.ndarray        # leading retractions per group
    all_deltas: np.ndarray     # [group, 1 + 2 * n_calls]: record count, then (value, count) per call
    lead_deltas: np.ndarray    # the same over the leading retractions only
    first: np.ndarray          # position of each group's first row in the bundle


def partial(functions, deltas: np.ndarray) -> list:
    """A row of deltas as a partial accumulator ``[record_count, [acc per call]]`` (what
    :meth:`_Aggs.merge` takes): COUNT's accumulator is the count, SUM/AVG's ``[sum, count]``."""
    accs = []
    for i, fn in enumerate(functions):
        value, count = int(deltas[1 + 2 * i]), int(deltas[2 + 2 * i])
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


def fold(bundle: pa.Table, group_keys: tuple[int, ...], calls) -> GroupDeltas:
    names = user_columns(bundle)
    keys = [names[i] for i in group_keys]
    kinds = bundle.column(KIND).to_numpy()
    sign = np.where((kinds == 0) | (kinds == 2), 1, -1).astype(np.int64)
    if keys:
        gid = bundle.select(keys).to_pandas().groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    else:                                   # a global aggregate: one group
        gid = np.zeros(bundle.num_rows, dtype=np.int64)
    n_groups = int(gid.max()) + 1 if len(gid) else 0
    leading = (pd.Series(sign > 0).groupby(gid).cumsum().to_numpy() == 0)

    columns = [sign]
    for call in calls:
        if call.column is None:
            columns += [sign, np.zeros_like(sign)]
            continue
        col = bundle.column(names[call.column])
        valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
        counted = np.where(valid, sign, 0)
        if isinstance(call.resolve(), Count):
            columns += [counted, np.zeros_like(sign)]
        else:
            values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            columns += [values * counted, counted]
    contrib = np.stack(columns, axis=1)
    all_deltas = np.zeros((n_groups, contrib.shape[1]), dtype=np.int64)
    lead_deltas = np.zeros_like(all_deltas)
    np.add.at(all_deltas, gid, contrib)
    np.add.at(lead_deltas, gid[leading], contrib[leading])
    _, first_pos = np.unique(gid, return_index=True)
    key_rows = bundle.select(keys).take(pa.array(first_pos)).to_pylist() if keys else [{}] * n_groups
    return GroupDeltas(
        keys=[tuple(r[k] for k in keys) for r in key_rows],
        rows=np.bincount(gid, minlength=n_groups),
        leading=np.bincount(gid[leading], minlength=n_groups),
        all_deltas=all_deltas, lead_deltas=lead_deltas, first=first_pos)
