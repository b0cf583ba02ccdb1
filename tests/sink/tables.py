"""Building changelog batches and reading Delta tables back, for the sink tests.

Tables are read through ``deltalake.QueryBuilder`` (never ``to_pyarrow_table``,
whose process may abort at exit).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from changelake.changelog import RowKind

KIND_CODES = {"+I": RowKind.INSERT, "-U": RowKind.UPDATE_BEFORE, "+U": RowKind.UPDATE_AFTER,
              "-D": RowKind.DELETE}


def seq(n: int) -> str:
    """A fixed-width ordering token, so string order is numeric order."""
    return f"s{n:010d}"


def changes(rows: Iterable[tuple[str, int, int, Any]], *, extra: dict[str, pa.Array] | None = None) -> pa.Table:
    """A changelog batch from ``(kind, id, seq number, value)`` tuples."""
    rows = list(rows)
    table = pa.table({
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "v": pa.array([r[3] for r in rows], pa.string()),
        "_kind": pa.array([int(KIND_CODES[r[0]]) for r in rows], pa.int8()),
        "_seq": pa.array([seq(r[2]) for r in rows], pa.string()),
    })
    for name, values in (extra or {}).items():
        table = table.add_column(table.num_columns - 2, name, values)
    return table


def read_rows(path: str, *, columns: str = "*", order_by: str = "id",
              storage_options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    table = DeltaTable(path, storage_options=storage_options)
    query = f"SELECT {columns} FROM t ORDER BY {order_by}"
    return pa.table(QueryBuilder().register("t", table).execute(query)).to_pylist()


def live(path: str, storage_options: dict[str, str] | None = None) -> dict[int, tuple[Any, str]]:
    """``{id: (v, _seq)}`` of the table's rows."""
    return {r["id"]: (r["v"], r["_seq"])
            for r in read_rows(path, columns='id, v, "_seq"', storage_options=storage_options)}


def tombstones(path: str, storage_options: dict[str, str] | None = None) -> dict[int, str]:
    """``{id: _seq}`` of a tombstone table (empty when it does not exist)."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options):
        return {}
    return {r["id"]: r["_seq"] for r in read_rows(path, columns='id, "_seq"', storage_options=storage_options)}
