"""Reading a Delta table's current rows without the JVM.

Goes through ``pyarrow.dataset`` over the files of the current snapshot
(``DeltaTable.file_uris()``): reading through ``DeltaTable.to_pyarrow_table()``
makes some processes abort at exit with deltalake 1.4-1.6 (see ARCHITECTURE.md).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable


def read_delta(path: str, *, storage_options: dict[str, str] | None = None,
               columns: list[str] | None = None) -> pa.Table:
    table = DeltaTable(path, storage_options=storage_options or None)
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
