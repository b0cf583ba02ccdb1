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


class Changes:
    """A changelog batch: ``kinds`` (RowKind codes) aligned with ``rows`` (tuples).

    A kernel that computes whole columns (the columnar inner join) appends them as an Arrow changelog
    table (:meth:`add_arrow`): they stay columnar into :meth:`to_arrow`, and become row tuples only when
    ``kinds``/``rows`` are read (in order with the tuples emitted around them).
    """

    __slots__ = ("_kinds", "_rows", "_tables")

    def __init__(self, kinds: list[int] | None = None, rows: list[tuple] | None = None) -> None:
        self._kinds = [] if kinds is None else kinds
        self._rows = [] if rows is None else rows
        #: (number of tuple rows before it, changelog table: user columns + ``_kind``)
        self._tables: list[tuple[int, pa.Table]] = []
        if len(self._kinds) != len(self._rows):
            raise ValueError(f"kinds ({len(self._kinds)}) and rows ({len(self._rows)}) differ in length")

    @property
    def kinds(self) -> list[int]:
        self._settle()
        return self._kinds

    @property
    def rows(self) -> list[tuple]:
        self._settle()
        return self._rows

    def _settle(self) -> None:
        """The Arrow parts as row tuples, in their places."""
        if not self._tables:
            return
        kinds, rows, done = [], [], 0
        for at, table in self._tables:
            kinds.extend(self._kinds[done:at])
            rows.extend(self._rows[done:at])
            part = Changes.from_arrow(table)
            kinds.extend(part._kinds)
            rows.extend(part._rows)
            done = at
        kinds.extend(self._kinds[done:])
        rows.extend(self._rows[done:])
        self._kinds, self._rows, self._tables = kinds, rows, []

    def __len__(self) -> int:
        return len(self._rows) + sum(t.num_rows for _, t in self._tables)

    def __iter__(self) -> Iterator[tuple[int, tuple]]:
        return zip(self.kinds, self.rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Changes):
            return NotImplemented
        return self.kinds == other.kinds and self.rows == other.rows

    def __repr__(self) -> str:
        return f"Changes(kinds={self.kinds!r}, rows={self.rows!r})"

    def emit(self, kind: int, row: Sequence) -> None:
        self._kinds.append(kind)
        self._rows.append(tuple(row))

    def add_arrow(self, table: pa.Table) -> None:
        """Append a changelog table (user columns in the output's order, then ``_kind``); its column names
        do not matter, :meth:`to_arrow` names them."""
        if table.num_rows:
            self._tables.append((len(self._rows), table))

    def extend(self, other: "Changes") -> None:
        at = len(self._rows)
        self._tables.extend((at + n, t) for n, t in other._tables)
        self._kinds.extend(other._kinds)
        self._rows.extend(other._rows)

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
        if not self._tables:
            return _tuples_to_arrow(self._kinds, self._rows, schema)
        parts, done = [], 0
        full = pa.schema([*schema, pa.field(KIND, pa.int8())])
        for at, table in self._tables + [(len(self._rows), None)]:
            if at > done:
                parts.append(_tuples_to_arrow(self._kinds[done:at], self._rows[done:at], schema))
            if table is not None:
                parts.append(_named(table, full))
            done = at
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _tuples_to_arrow(kinds: list[int], rows: list[tuple], schema: pa.Schema) -> pa.Table:
    names = [f.name for f in schema]
    values = list(zip(*rows)) if rows else [() for _ in schema]   # one transpose, in C
    columns = [_column(list(v), f) for v, f in zip(values, schema)]
    columns.append(pa.array(kinds, type=pa.int8()))
    return pa.Table.from_arrays(columns, names=names + [KIND])


def _named(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A changelog table computed in columns, with ``schema``'s names and types (and chunk layout)."""
    if table.num_columns != len(schema):
        raise ValueError(f"a columnar part has {table.num_columns} columns, the output {len(schema)}")
    columns = [c if c.type == f.type else c.cast(f.type) for c, f in zip(table.columns, schema)]
    return pa.Table.from_arrays(columns, schema=schema)


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
