"""The batch type every kernel consumes and returns: row kinds plus row tuples.

A kernel works on a :class:`Changes` batch: ``kinds[i]`` is the
:class:`~changelake.changelog.RowKind` code of ``rows[i]``, a tuple of the user
columns in schema order. :meth:`Changes.from_arrow` / :meth:`Changes.to_arrow`
convert at the boundary to the changelog contract (user columns plus ``_kind``).
Reserved metadata columns other than ``_kind`` do not travel through operators:
an operator's output rows are new rows.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import pyarrow as pa

from changelake.changelog import KIND, RowKind, user_columns
from changelake.errors import ValueOverflowError
from changelake.operators._values import canonical, canonical_column

INSERT = int(RowKind.INSERT)
UPDATE_BEFORE = int(RowKind.UPDATE_BEFORE)
UPDATE_AFTER = int(RowKind.UPDATE_AFTER)
DELETE = int(RowKind.DELETE)

ACCUMULATE_KINDS = frozenset((INSERT, UPDATE_AFTER))


def is_accumulate(kind: int) -> bool:
    """+I and +U add a row; -U and -D retract one."""
    return kind == INSERT or kind == UPDATE_AFTER


@dataclass
class Changes:
    """A changelog batch: ``kinds`` (RowKind codes) aligned with ``rows`` (tuples)."""

    kinds: list[int] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.kinds) != len(self.rows):
            raise ValueError(f"kinds ({len(self.kinds)}) and rows ({len(self.rows)}) differ in length")

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[int, tuple]]:
        return zip(self.kinds, self.rows)

    def emit(self, kind: int, row: Sequence) -> None:
        self.kinds.append(kind)
        self.rows.append(tuple(row))

    def extend(self, other: "Changes") -> None:
        self.kinds.extend(other.kinds)
        self.rows.extend(other.rows)

    def slice(self, start: int, stop: int) -> "Changes":
        return Changes(self.kinds[start:stop], self.rows[start:stop])

    @classmethod
    def of(cls, records: Iterable[tuple[int | str, Sequence]]) -> "Changes":
        """Build from ``(kind, row)`` pairs; kind as a code or as ``"+I"``/``"-U"``/``"+U"``/``"-D"`` (a NaN
        becomes a ``SqlNaN``, as in :meth:`from_arrow`)."""
        out = cls()
        for kind, row in records:
            out.emit(int(RowKind.from_short(kind)) if isinstance(kind, str) else int(kind), map(canonical, row))
        return out

    def as_pairs(self) -> list[tuple[str, tuple]]:
        """``[("+I", row), ...]`` for logs and tests."""
        return [(RowKind(k).short, r) for k, r in zip(self.kinds, self.rows)]

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> "Changes":
        """Read a changelog batch (user columns plus ``_kind``); a float NaN is read as a ``SqlNaN`` with
        its bits, which equals every NaN (:mod:`._values`)."""
        if KIND not in table.column_names:
            raise ValueError(f"changelog batch has no {KIND!r} column; columns are {table.column_names}")
        cols = [canonical_column(c, c.to_pylist()) for c in (table.column(n) for n in user_columns(table))]
        kinds = [int(k) for k in table.column(KIND).to_pylist()]
        return cls(kinds, list(zip(*cols)) if cols else [() for _ in kinds])

    def to_arrow(self, schema: pa.Schema) -> pa.Table:
        """Write as a changelog batch: ``schema``'s user columns plus ``_kind`` (int8).

        A computed value its column cannot hold (a SUM beyond BIGINT) raises :class:`ValueOverflowError`.
        """
        names = [f.name for f in schema]
        values = list(zip(*self.rows)) if self.rows else [() for _ in schema]   # one transpose, in C
        columns = [_column(list(v), f) for v, f in zip(values, schema)]
        columns.append(pa.array(self.kinds, type=pa.int8()))
        return pa.Table.from_arrays(columns, names=names + [KIND])


def _column(values: list, f: pa.Field) -> pa.Array:
    try:
        return pa.array(values, type=f.type)
    except (OverflowError, pa.ArrowInvalid):
        numeric = pa.types.is_integer(f.type) or pa.types.is_decimal(f.type)
        for v in values if numeric else ():
            if isinstance(v, (int, decimal.Decimal)) and not isinstance(v, bool) and _too_large(v, f.type):
                raise ValueOverflowError(
                    f"column {f.name!r} is {f.type} and cannot hold {v}: a SUM over BIGINT is BIGINT and a SUM "
                    "over DECIMAL(p, s) is DECIMAL(38, s), and one that leaves its type fails, as in Spark's ANSI "
                    "mode; to sum past BIGINT, cast the column to DECIMAL(38, 0) with a select before the "
                    "aggregate (a DECIMAL(38, s) sum: to a smaller scale)") from None
        raise


def _too_large(v: int | decimal.Decimal, t: pa.DataType) -> bool:
    """True if ``v``'s integer part is too large for ``t`` (not: it has more decimal places than ``t``)."""
    if pa.types.is_decimal(t):
        digits = decimal.Decimal(v).adjusted() + 1
        return digits > t.precision - t.scale
    try:
        pa.array([v], type=t)
        return False
    except (OverflowError, pa.ArrowInvalid):
        return True


def coerce(batch: "Changes | pa.Table | pa.RecordBatch") -> Changes:
    """Accept either batch representation at a kernel's entry point."""
    if isinstance(batch, Changes):
        return batch
    return Changes.from_arrow(batch)


def project(row: tuple, indices: Sequence[int]) -> tuple:
    """The values of ``row`` at ``indices`` (a key)."""
    return tuple(row[i] for i in indices)
