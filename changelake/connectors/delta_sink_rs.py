"""delta-rs engine of the Delta upsert sink (package ``deltalake``; no JVM).

Reads go through ``deltalake.QueryBuilder`` only: a process that reads through
``DeltaTable.to_pyarrow_table()`` / ``to_pyarrow_dataset()`` may abort at exit
(see ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime, timedelta

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from changelake.changelog import KIND, SEQ
from changelake.connectors.delta_sink import DeltaUpsertSink, MergeCounts
from changelake.connectors.delta_sink_kernel import without_views
from changelake.connectors.delta_sink_merge import (
    MergeClauses,
    datafusion_null_safe_equal,
    table_merge,
    tombstone_merge,
)
from changelake.connectors.delta_sink_merge import double_quote as quote
from changelake.connectors.delta_sink_schema import DELETED_AT

#: How object_store (under delta-rs) words a missing object, on every store.
_FILE_GONE = "not found"

#: The tombstone table is compacted, at expiry time, once it has more files than this.
COMPACT_ABOVE_FILES = 8


def buffered_merge_is_exact(schema: pa.Schema, primary_key: tuple[str, ...]) -> bool:
    """Whether delta-rs may MERGE on ``primary_key`` with a buffered source (``streamed_exec=False``).

    Buffered, delta-rs (1.6.6) turns the source's key range into a filter on the target, and gets it
    wrong for two key types: a DECIMAL(p, 0) key at or beyond 2^63 matches nothing (every upsert
    inserts another row), and in a file whose FLOAT / DOUBLE key column holds a NaN beside one other
    value (file statistics leave NaN out, so min = max), the NaN is rewritten with that value when an
    upsert touches the file (another key's row silently changes). Streamed, the MERGE is exact for
    both, so a table keyed by a floating-point or decimal column is merged streamed; the others keep
    the buffered MERGE's file skipping.
    """
    return not any(pa.types.is_floating(schema.field(k).type) or pa.types.is_decimal(schema.field(k).type)
                   for k in primary_key)


def read_tombstone_keys(table: DeltaTable, primary_key: tuple[str, ...]) -> pa.Table:
    """The key columns and ``_seq`` of every tombstone in ``table`` (a tombstone table) at its handle's
    version, as the sink's copy holds them (``DeltaUpsertSink._tombstones``)."""
    columns = ", ".join(quote(c) for c in (*primary_key, SEQ))
    reader = QueryBuilder().register("tombstones", table).execute(f"SELECT {columns} FROM tombstones")
    return without_views(pa.table(reader))


class DeltaRsSink(DeltaUpsertSink):
    """Upsert sink that commits with delta-rs; the embedded default."""

    engine = "delta-rs"
    tombstones_read_by_delta_rs = True

    def _commit(self, batch_id: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)],
                                custom_metadata={**self.commit_metadata, **self._schedule_metadata()} or None)

    def _create_table(self, schema: pa.Schema, *, properties: Mapping[str, str], path: str | None = None,
                      partition_by: tuple[str, ...] | None = None) -> None:
        target = path or self.spec.path
        parts = self.spec.partition_by if partition_by is None else partition_by
        DeltaTable.create(
            target, schema, mode="ignore", partition_by=list(parts) or None,
            name=self.spec.name if path is None else None,
            configuration=dict(properties), storage_options=dict(self.spec.storage_options) or None,
            raise_if_key_not_exists=False,
        )

    def _add_columns(self, fields: list[pa.Field]) -> None:
        table = self._log(self.spec.path)
        table.alter.add_columns([Field.from_arrow(f) for f in fields])

    def _rewrite_table(self, schema: pa.Schema, *, path: str | None = None) -> None:
        target = path or self.spec.path
        table = self._log(target) if target in self._logs else DeltaTable(
            target, storage_options=dict(self.spec.storage_options) or None)
        columns = ", ".join(quote(f.name) for f in schema)
        data = pa.table(QueryBuilder().register("t", table).execute(f"SELECT {columns} FROM t"))
        data = pa.Table.from_arrays([data[f.name].cast(f.type) for f in schema], schema=schema)
        write_deltalake(table, data, mode="overwrite", schema_mode="overwrite",
                        partition_by=list(table.metadata().partition_columns) or None)

    def _read_tombstones(self) -> pa.Table:
        return read_tombstone_keys(self._log(self.tombstone_path), self.spec.primary_key)

    def _merge(self, table: DeltaTable, changes: pa.Table, clauses: MergeClauses, batch_id: int) -> dict:
        # streamed_exec=False: the (driver-sized) source is buffered, which lets delta-rs derive
        # key-range filters from it and skip target files no change can touch (4x faster on
        # key-clustered changes in docs/benchmarks-sink.md; equal on random keys) -- unless a key
        # column holds values those filters get wrong (buffered_merge_is_exact).
        buffered = buffered_merge_is_exact(changes.schema, self.spec.primary_key)
        merge = (table.merge(changes, clauses.on, source_alias="s", target_alias="t", streamed_exec=not buffered,
                             commit_properties=self._commit(batch_id))
                 .when_matched_update(dict(clauses.update_set), predicate=clauses.update_when)
                 .when_matched_delete(predicate=clauses.delete_when)
                 .when_not_matched_insert(dict(clauses.insert_values), predicate=clauses.insert_when))
        if clauses.delete_unmatched:
            merge = merge.when_not_matched_by_source_delete()
        return merge.execute()

    def _merge_tombstones(self, changes: pa.Table, *, batch_id: int) -> None:
        clauses = tombstone_merge(self.spec.primary_key, quote, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=datafusion_null_safe_equal)
        self._merge(self._log(self.tombstone_path), changes, clauses, batch_id)

    def _merge_table(self, changes: pa.Table, *, batch_id: int, unavailable: Mapping[str, str] = {},
                     replace: bool = False) -> MergeCounts:
        table = self._log(self.spec.path)
        before = table.version()
        inserted = updated = deleted = 0
        if changes.num_rows or replace:
            columns = [c for c in changes.column_names if c != KIND]
            clauses = table_merge(self.spec.primary_key, columns, quote, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=datafusion_null_safe_equal, unavailable=unavailable,
                                  replace=replace)
            stats = self._merge(table, changes, clauses, batch_id)
            inserted = stats["num_target_rows_inserted"]
            updated = stats["num_target_rows_updated"]
            deleted = stats["num_target_rows_deleted"]
        return self._recorded(table, before, batch_id, MergeCounts(inserted=inserted, updated=updated,
                                                                     deleted=deleted, version=before))

    def _recorded(self, table: DeltaTable, before: int, batch_id: int, counts: MergeCounts) -> MergeCounts:
        """``counts`` at the table's version after a MERGE of ``batch_id``. delta-rs writes no commit for a
        MERGE that changed nothing: the batch's txn is then recorded by an empty append, so that a replay
        of this batch is recognised."""
        if table.version() == before:
            schema = pa.schema(table.schema().to_arrow())
            write_deltalake(table, schema.empty_table(), mode="append", commit_properties=self._commit(batch_id))
            table.update_incremental()
        return dataclasses.replace(counts, version=table.version())

    def _delete_tombstones_before(self, cutoff: datetime) -> int:
        table = self._log(self.tombstone_path)
        stats = table.delete(f"{quote(DELETED_AT)} < '{cutoff.isoformat()}'")
        return int(stats.get("num_deleted_rows", 0))

    def _compact_tombstones(self) -> None:
        table = self._log(self.tombstone_path)
        if len(table.file_uris()) > COMPACT_ABOVE_FILES:
            table.optimize.compact()

    def _seq_column(self) -> str:
        return quote(SEQ)

    def _set_properties(self, properties: Mapping[str, str]) -> None:
        self._log(self.spec.path).alter.set_table_properties(dict(properties), raise_if_not_exists=False)

    def _delete_where(self, predicate: str) -> int:
        stats = self._log(self.spec.path).delete(predicate)
        return int(stats.get("num_deleted_rows", 0))

    def _any_row(self, predicate: str) -> bool:
        reader = QueryBuilder().register("t", self._log(self.spec.path)).execute(
            f"SELECT 1 AS hit FROM t WHERE {predicate} LIMIT 1")
        return pa.table(reader).num_rows > 0

    def _compact_table(self) -> None:
        self._log(self.spec.path).optimize.compact()

    def _vacuum(self, path: str, retention: timedelta) -> int:
        # whole hours, rounded up: never fewer than asked for; the retention is the user's choice, so
        # the table's delta.deletedFileRetentionDuration (default 7 days) does not veto a shorter one
        hours = math.ceil(retention.total_seconds() / 3600)
        return len(self._log(path).vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False))

    def _is_conflict(self, exc: BaseException) -> bool:
        """A commit conflict, or a data file of the sink's snapshot gone (another job's VACUUM removed the
        files its OPTIMIZE replaced): both are retried from a fresh snapshot."""
        return isinstance(exc, CommitFailedError) or (isinstance(exc, DeltaError) and _FILE_GONE in str(exc))
