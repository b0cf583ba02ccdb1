"""SQL semantics of the values kernels compare: NaN equals NaN, and sorts above every number.

Kernels hold row values as Python objects and compare them with ``==``, ``<`` and ``hash``
(dict keys, ``in``, ``sorted``). For every type but floating point, Python's semantics are
SQL's. A float NaN is not: ``nan != nan``, its hash is its object's identity (Python 3.10+),
and every ordering comparison with it is False. So a row holding a NaN would never match
its own retraction (a Top-N, a materializer, a MIN/MAX count per value, a join row without
a unique key), a group or join key holding one would split into one group per row, and a
sort would place it arbitrarily. SQL (Spark, DuckDB, Flink) treats NaN as one value, equal
to itself and greater than every other number, +Infinity included.

=====================  ============================================================
where                  rule
=====================  ============================================================
kernel input           every NaN of a FLOAT / DOUBLE column becomes a :class:`SqlNaN`
                       with the same bits (:func:`canonical_column`, used by
                       ``Changes.from_arrow``), so a row keeps its NaN's sign and payload
computed values        an aggregate result that is NaN becomes one (:func:`canonical`)
equality, hashing      a :class:`SqlNaN` equals any NaN and hashes to a constant, also
                       after a snapshot round trip (it pickles by name, with its bits)
ordering               :func:`compare` and :func:`sort_key`: NaN above every number
=====================  ============================================================

Where SQL calls two NaNs one value (a MIN/MAX result, a group key), which NaN's bits the
result carries is not defined.

``-0.0`` and ``0.0`` stay apart as values (a row keeps its sign of zero) but compare equal,
as in SQL; which of two equal zeros MIN/MAX returns is not defined (DuckDB returns the last).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


class SqlNaN(float):
    """The NaN kernels hold: equal to every NaN, one hash, pickled by name (see the module docstring).
    It keeps the bits of the NaN it was made from."""

    __slots__ = ()

    def __new__(cls, value: float = math.nan) -> "SqlNaN":
        if not math.isnan(value):
            raise ValueError(f"SqlNaN holds a NaN, not {value!r}")
        return super().__new__(cls, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and math.isnan(other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return 0x7FF8_0000

    def __reduce__(self):
        return (sql_nan, (float(self),))

    def __repr__(self) -> str:
        return "nan"


#: A quiet NaN as the kernels hold it.
NAN = SqlNaN()


def sql_nan(value: float = math.nan) -> SqlNaN:
    """A :class:`SqlNaN` with ``value``'s bits (what a pickled one restores to)."""
    return SqlNaN(value)


def canonical(value: Any) -> Any:
    """``value``, a float NaN made a :class:`SqlNaN` (same bits)."""
    if isinstance(value, float) and value != value and type(value) is not SqlNaN:
        return SqlNaN(value)
    return value


def canonical_column(column: pa.ChunkedArray | pa.Array, values: list) -> list:
    """``values`` (``column.to_pylist()``) with every NaN made a :class:`SqlNaN` (same bits); unchanged
    (the same list) unless ``column`` is floating point and holds a NaN."""
    if not pa.types.is_floating(column.type) or not len(column) or not pc.any(pc.is_nan(column)).as_py():
        return values
    return [SqlNaN(v) if v is not None and v != v else v for v in values]


def is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare(x: Any, y: Any) -> int:
    """-1, 0 or 1 as SQL orders two non-null values of one type (NaN above every number)."""
    if isinstance(x, float) and isinstance(y, float):
        xn, yn = math.isnan(x), math.isnan(y)
        if xn or yn:
            return (xn > yn) - (xn < yn)
    if x == y:
        return 0
    return -1 if x < y else 1


def sort_key(value: Any) -> Any:
    """A key that sorts non-null values of one type as :func:`compare` does."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, 0) if isinstance(value, float) and math.isnan(value) else (0, value)
    return value
