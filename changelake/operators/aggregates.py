"""Aggregate functions with retraction, as used by :mod:`group_aggregate`.

An accumulator is a plain value (int, list, dict) so that it snapshots with the
operator state. Every function supports ``retract`` (undo one ``accumulate``) and
``merge`` (two-phase aggregation). Nulls are skipped by the built-ins, as in SQL.
MIN/MAX keep a count per value so that retracting the current extreme finds the
next one exactly.
"""

from __future__ import annotations

from typing import Any

from changelake.errors import ConfigError


class AggregateFunction:
    """Protocol for built-in and user-defined aggregates (subclass and override)."""

    name = "agg"
    #: False: the function also sees NULL inputs (e.g. a UDF that counts nulls).
    skips_nulls = True

    def create(self) -> Any:
        raise NotImplementedError

    def accumulate(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def retract(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, acc: Any, other: Any) -> Any:
        raise NotImplementedError(f"{self.name} cannot be merged (two-phase aggregation)")

    def value(self, acc: Any) -> Any:
        raise NotImplementedError


class Count(AggregateFunction):
    """COUNT(col) (nulls skipped) or COUNT(*) when the call has no column."""

    name = "COUNT"

    def create(self):
        return 0

    def accumulate(self, acc, value):
        return acc + 1

    def retract(self, acc, value):
        return acc - 1

    def merge(self, acc, other):
        return acc + other

    def value(self, acc):
        return acc


class Sum(AggregateFunction):
    """SUM with retraction: ``[sum, count of non-null values]``; NULL when no value is left."""

    name = "SUM"

    def create(self):
        return [0, 0]

    def accumulate(self, acc, value):
        return [acc[0] + value, acc[1] + 1]

    def retract(self, acc, value):
        return [acc[0] - value, acc[1] - 1]

    def merge(self, acc, other):
        return [acc[0] + other[0], acc[1] + other[1]]

    def value(self, acc):
        return acc[0] if acc[1] != 0 else None


class Avg(Sum):
    """AVG: like Flink, integer input gives an integer result (truncated toward zero)."""

    name = "AVG"

    def value(self, acc):
        total, n = acc
        if n == 0:
            return None
        if isinstance(total, int):
            q = abs(total) // abs(n)
            return q if (total >= 0) == (n > 0) else -q
        return total / n


class _Extreme(AggregateFunction):
    """MIN/MAX with retraction: ``{value: count}``; the extreme is recomputed from the keys."""

    pick = staticmethod(max)

    def create(self):
        return {}

    def accumulate(self, acc, value):
        acc = dict(acc)
        acc[value] = acc.get(value, 0) + 1
        return acc

    def retract(self, acc, value):
        acc = dict(acc)
        n = acc.get(value, 0) - 1
        if n == 0:
            del acc[value]
        else:
            acc[value] = n  # a negative count records a retraction that arrived before its row
        return acc

    def merge(self, acc, other):
        acc = dict(acc)
        for v, n in other.items():
            m = acc.get(v, 0) + n
            if m == 0:
                acc.pop(v, None)
            else:
                acc[v] = m
        return acc

    def value(self, acc):
        alive = [v for v, n in acc.items() if n > 0]
        return self.pick(alive) if alive else None


class Max(_Extreme):
    name = "MAX"
    pick = staticmethod(max)


class Min(_Extreme):
    name = "MIN"
    pick = staticmethod(min)


BUILTINS: dict[str, type[AggregateFunction]] = {"COUNT": Count, "SUM": Sum, "AVG": Avg, "MIN": Min, "MAX": Max}


def builtin(name: str) -> AggregateFunction:
    try:
        return BUILTINS[name.upper()]()
    except KeyError:
        raise ConfigError(f"unknown aggregate function {name!r}; built-ins are {sorted(BUILTINS)} "
                          "(pass an AggregateFunction instance for a user-defined one)") from None
