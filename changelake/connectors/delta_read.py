"""Reading a Delta table's current rows without the JVM.

Goes through ``pyarrow.dataset`` over the files of the current snapshot
(``DeltaTable.file_uris()``): reading through ``DeltaTable.to_pyarrow_table()``
makes some processes abort at exit with deltalake 1.4-1.6 (see ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from changelake.changelog import KIND, RowKind


def read_delta(path: str, *, storage_options: dict[str, str] | None = None,
               columns: list[str] | None = None, version: int | None = None) -> pa.Table:
    """The table's rows (at ``version``: time travel; None: the current snapshot)."""
    table = DeltaTable(path, storage_options=storage_options or None, version=version)
    schema = pa.schema(table.schema().to_arrow())
    partition_cols = table.metadata().partition_columns
    uris = table.file_uris()
    if not uris:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    partitioning = ds.partitioning(pa.schema([schema.field(c) for c in partition_cols]), flavor="hive") \
        if partition_cols else None
    dataset = ds.dataset(uris, schema=schema, format="parquet", partitioning=partitioning)
    return dataset.to_table(columns=columns)


def version_at_position(path: str, app_id: str, position: int, *,
                        storage_options: dict[str, str] | None = None) -> int | None:
    """The newest version of the table whose recorded transaction version of ``app_id`` is at most
    ``position`` (a commit position, ``changelake.changelog.commit_position``): the table as the batch at
    ``position`` left it, also when a later batch (half written before a crash) committed to it since.
    None: the table does not exist, or no version is that old."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options or None):
        return None
    table = DeltaTable(path, storage_options=storage_options or None)
    version = table.version()
    while version >= 0:
        recorded = table.transaction_version(app_id)
        if recorded is None or recorded <= position:
            return version
        version -= 1
        try:
            table.load_as_version(version)
        except Exception:  # the log before it was cleaned up (delta.logRetentionDuration)
            return None
    return None


def table_columns(path: str, version: int, *, storage_options: dict[str, str] | None = None) -> set[str]:
    """The names of the table's columns at ``version``."""
    return set(pa.schema(DeltaTable(path, version=version, storage_options=storage_options or None)
                         .schema().to_arrow()).names)


@dataclass(frozen=True)
class TableSnapshot:
    """A mirrored table at one version as changes: every row an insert (``_kind`` +I) with the ``_seq`` it
    holds; the input snapshot a rebuilt view starts from (``changelake.service.rebuild``). Picklable: it is
    read in a Spark task."""

    path: str
    version: int
    storage_options: dict[str, str] = field(default_factory=dict)

    def changes(self) -> pa.Table:
        rows = read_delta(self.path, storage_options=self.storage_options, version=self.version)
        kinds = pa.array([RowKind.INSERT.value] * rows.num_rows, pa.int8())
        rows = rows.drop_columns([KIND]) if KIND in rows.column_names else rows
        return rows.append_column(KIND, kinds)
