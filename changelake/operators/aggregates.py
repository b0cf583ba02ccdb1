"""Aggregate functions with retraction, as used by :mod:`group_aggregate`.

An accumulator is a plain value (int, list, dict) so that it snapshots with the
operator state. Every function supports ``retract`` (undo one ``accumulate``) and
``merge`` (two-phase aggregation). Nulls are skipped by the built-ins, as in SQL.
MIN/MAX keep a count per value so that retracting the current extreme finds the
next one exactly.
"""

from __future__ import annotations

import decimal
from typing import Any

from changelake.errors import ConfigError
from changelake.operators._values import compare, sort_key


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


#: Decimal arithmetic of SUM: exact for any sum of DECIMAL(38, s) values, and it raises instead of
#: rounding (Python's default context rounds to 28 significant digits, fewer than DECIMAL(38, s) holds).
EXACT = decimal.Context(prec=120, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow])
#: AVG's decimal division, rounded to the input's scale
_HALF_UP = decimal.Context(prec=120, rounding=decimal.ROUND_HALF_UP, traps=[decimal.InvalidOperation])


def add(a, b):
    """``a + b``, exact for decimals (:data:`EXACT`); integers are Python's unbounded ints."""
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return EXACT.add(a, b)
    return a + b


def subtract(a, b):
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return EXACT.subtract(a, b)
    return a - b


class Sum(AggregateFunction):
    """SUM with retraction: ``[sum, count of non-null values]``; NULL when no value is left.

    The sum is exact: integers add as Python ints (a retraction may bring a sum that left BIGINT
    back into it), decimals in :data:`EXACT`. A result that does not fit the output column (BIGINT
    for integer input, DECIMAL(38, s) for decimal input) fails where the row is written
    (``Changes.to_arrow``), as Spark's ANSI mode fails; cast the input to a wider DECIMAL to sum it.
    """

    name = "SUM"

    def create(self):
        return [0, 0]

    def accumulate(self, acc, value):
        return [add(acc[0], value), acc[1] + 1]

    def retract(self, acc, value):
        return [subtract(acc[0], value), acc[1] - 1]

    def merge(self, acc, other):
        return [add(acc[0], other[0]), acc[1] + other[1]]

    def value(self, acc):
        return acc[0] if acc[1] != 0 else None


class Avg(Sum):
    """AVG: like Flink, integer input gives an integer result (truncated toward zero); DECIMAL(p, s)
    input gives DECIMAL(38, s), rounded half up (as Flink and Spark round decimal division)."""

    name = "AVG"

    def value(self, acc):
        total, n = acc
        if n == 0:
            return None
        if isinstance(total, int):
            q = abs(total) // abs(n)
            return q if (total >= 0) == (n > 0) else -q
        if isinstance(total, decimal.Decimal):
            scale = decimal.Decimal(1).scaleb(total.as_tuple().exponent)
            return _HALF_UP.divide(total, n).quantize(scale, context=_HALF_UP)
        return total / n


class _Extreme(AggregateFunction):
    """MIN/MAX with retraction: ``[extreme, {value: count}]``, updated in place.

    The count per value makes retracting the current extreme exact: only then is the
    extreme recomputed from the values still counted. Values order as in SQL (a NaN above
    every number, see ``_values``).
    """

    pick = staticmethod(max)
    #: 1: the greatest value wins (MAX), -1: the least (MIN)
    direction = 1

    def create(self):
        return [None, {}]

    def _better(self, a, b) -> bool:
        return compare(a, b) * self.direction > 0

    def accumulate(self, acc, value):
        counts = acc[1]
        n = counts.get(value, 0) + 1
        if n == 0:
            del counts[value]
        else:
            counts[value] = n
        if n > 0 and (acc[0] is None or self._better(value, acc[0])):
            acc[0] = value
        elif n <= 0 and value == acc[0]:
            acc[0] = self._recompute(counts)
        return acc

    def retract(self, acc, value):
        counts = acc[1]
        n = counts.get(value, 0) - 1
        if n == 0:
            del counts[value]
        else:
            counts[value] = n  # a negative count records a retraction that arrived before its row
        if n <= 0 and value == acc[0]:
            acc[0] = self._recompute(counts)
        return acc

    def _recompute(self, counts):
        alive = [v for v, n in counts.items() if n > 0]
        return self.pick(alive, key=sort_key) if alive else None

    def merge(self, acc, other):
        counts = acc[1]
        for v, n in other[1].items():
            m = counts.get(v, 0) + n
            if m == 0:
                counts.pop(v, None)
            else:
                counts[v] = m
        acc[0] = self._recompute(counts)
        return acc

    def value(self, acc):
        return acc[0]


class Max(_Extreme):
    name = "MAX"
    pick = staticmethod(max)


class Min(_Extreme):
    name = "MIN"
    pick = staticmethod(min)
    direction = -1


BUILTINS: dict[str, type[AggregateFunction]] = {"COUNT": Count, "SUM": Sum, "AVG": Avg, "MIN": Min, "MAX": Max}


def builtin(name: str) -> AggregateFunction:
    try:
        return BUILTINS[name.upper()]()
    except KeyError:
        raise ConfigError(f"unknown aggregate function {name!r}; built-ins are {sorted(BUILTINS)} "
                          "(pass an AggregateFunction instance for a user-defined one)") from None
