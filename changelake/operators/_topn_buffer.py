"""Sorted buffer of one Top-N partition: sort keys in order, each with its rows in arrival order.

Plain lists (``[[sort_key, [item, ...]], ...]``) so that it snapshots as operator state.
The order of sort keys is given by :class:`SortOrder` (per column: direction, nulls first/last;
values order as in SQL, a NaN above every number: ``_values``).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from changelake.errors import ConfigError
from changelake.operators._values import compare


@dataclass(frozen=True)
class SortColumn:
    column: int
    ascending: bool = True
    nulls_last: bool = True


@functools.total_ordering
class _Descending:
    """Reverses the natural order of a non-null value (for DESC columns of non-numeric type)."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.v == other.v

    def __lt__(self, other: "_Descending") -> bool:
        return other.v < self.v


class SortOrder:
    """Compares sort keys (tuples of the sort columns' values) like ``ORDER BY``."""

    def __init__(self, columns: Sequence[SortColumn]) -> None:
        if not columns:
            raise ConfigError("Top-N needs at least one ORDER BY column")
        self.columns = tuple(columns)
        self.indices = tuple(c.column for c in columns)
        self._null_flags = tuple(1 if c.nulls_last else -1 for c in columns)
        self._ascending = tuple(c.ascending for c in columns)

    def of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.indices)

    def compare(self, a: tuple, b: tuple) -> int:
        for spec, x, y in zip(self.columns, a, b):
            if x is None or y is None:
                if x is None and y is None:
                    continue
                first_is_null = x is None
                return (1 if first_is_null else -1) * (1 if spec.nulls_last else -1)
            r = compare(x, y)
            if r:
                return r if spec.ascending else -r
        return 0

    def key(self, sort_key: tuple) -> tuple:
        """A natively comparable key with the order of :meth:`compare` (for bisect and sorting): three flat
        items per column, ``(nulls, nan, value)``. A NULL is ``(±1, 0, 0)`` (+1 sorts it after every value,
        -1 before), a NaN ``(0, ±1, 0)`` (above every number, or below in a DESC column), any other value
        ``(0, 0, value)`` (negated, or reversed, for DESC). The third items meet only when the first two
        tie, i.e. for two values of the column's own type. Flat, so that comparing two keys is one tuple
        comparison without nested ones."""
        out: list = []
        for ascending, flag, v in zip(self._ascending, self._null_flags, sort_key):
            kind = type(v)
            if kind is int or (kind is float and v == v):       # the common case first (not bool, not NaN)
                out += (0, 0, v if ascending else -v)
            elif v is None:
                out += (flag, 0, 0)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):   # NaN above every number
                if isinstance(v, float) and math.isnan(v):
                    out += (0, 1 if ascending else -1, 0)
                else:
                    out += (0, 0, v if ascending else -v)
            else:
                out += (0, 0, v if ascending else _Descending(v))
        return tuple(out)


class TopNBuffer:
    """Operations on the ``[[sort_key, [items]], ...]`` list of one partition.

    ``native`` holds each entry's sort key in :meth:`SortOrder.key`'s natively comparable form, in the same
    order, so that finding a sort key is a bisection over plain tuples. Building those forms cost more than
    the rest of a retracting Top-N when each search made them anew for the ~11 entries it probed (~60 % of a
    Top-3's CPU in issue 29's graph: docs/benchmarks.md); a kernel keeps a partition's list between the
    rows it processes (:meth:`TopNBase._buffer`). Every change of the entries goes through this class, which
    changes both lists alike; the snapshot holds the entries only.
    """

    def __init__(self, order: SortOrder, entries: list | None = None, native: list | None = None) -> None:
        self.order = order
        self.entries: list[list[Any]] = entries if entries is not None else []
        self.native: list[tuple] = native if native is not None else [order.key(e[0]) for e in self.entries]

    def _find(self, sort_key: tuple) -> tuple[int, bool]:
        i = bisect.bisect_left(self.native, self.order.key(sort_key))
        found = i < len(self.entries) and self.order.compare(self.entries[i][0], sort_key) == 0
        return i, found

    def put(self, sort_key: tuple, item: Any) -> int:
        """Append ``item`` under ``sort_key``; returns the number of items now under that key."""
        i, found = self._find(sort_key)
        if found:
            self.entries[i][1].append(item)
            return len(self.entries[i][1])
        self.entries.insert(i, [sort_key, [item]])
        self.native.insert(i, self.order.key(sort_key))
        return 1

    def get(self, sort_key: tuple) -> list | None:
        i, found = self._find(sort_key)
        return self.entries[i][1] if found else None

    def remove_item(self, sort_key: tuple, item: Any) -> bool:
        i, found = self._find(sort_key)
        if not found or item not in self.entries[i][1]:
            return False
        self.entries[i][1].remove(item)
        if not self.entries[i][1]:
            self._delete(i)
        return True

    def remove_key(self, sort_key: tuple) -> None:
        i, found = self._find(sort_key)
        if found:
            self._delete(i)

    def _delete(self, index: int) -> None:
        del self.entries[index]
        del self.native[index]

    def truncate(self, count: int) -> None:
        """Keep the first ``count`` sort keys only."""
        del self.entries[count:]
        del self.native[count:]

    def drop_if_empty(self, index: int) -> None:
        """Drop the sort key at ``index`` (-1: none) when its last item was removed in place. The
        retractions remove items of one sort key only, so that entry is the only one that can be empty:
        one check instead of a pass over the partition (which cost ~1 s per micro-batch of 4,000 updates
        over Top-3 partitions of 2,000 rows: docs/benchmarks.md, issue 29)."""
        if index >= 0 and not self.entries[index][1]:
            self._delete(index)

    def remove_last(self) -> Any:
        if not self.entries:
            return None
        items = self.entries[-1][1]
        item = items.pop()
        if not items:
            self._delete(len(self.entries) - 1)
        return item

    def last(self) -> tuple[tuple, Any] | None:
        if not self.entries:
            return None
        return self.entries[-1][0], self.entries[-1][1][-1]

    def size(self) -> int:
        return sum(len(e[1]) for e in self.entries)

    def __iter__(self) -> Iterator[list]:
        return iter(self.entries)

    def same_key(self, a: tuple, b: tuple) -> bool:
        return self.order.compare(a, b) == 0
