"""SCD type 2 history tables on the delta-rs engine (``TableSpec.history == "scd2"``).

Per batch (the versions' rules are in :mod:`changelake.connectors.history_kernel`)::

    table records txn (app_id, v) with v >= batch_id   -> skip: committed=False (replay)
    create the table (user columns, _seq, _source_ts, __start_at, __end_at) / add new columns
    read the stored versions and the logged states of the batch's keys
    rebuild those keys' histories (history_kernel.rebuild_history)
    append the new states to the state log (txn app_id, batch_id), skipped if already recorded
    MERGE the changed versions ON key AND __start_at (txn app_id, batch_id)

The state log lives where an upsert table keeps its tombstones (``TableSpec.tombstone_path``): the
table's columns without the interval, ``_kind`` (+I a row, -D a delete) and ``_logged_at``. It
holds what the versions do not show: deletes (one that closed nothing yet still closes the version
a late insert opens) and the rows in-place writes replaced. States older than
``tombstone_retention`` expire on the tombstone schedule. A crash between the two commits leaves
the log ahead of the table; the replay of the batch skips the log's commit and rebuilds the same
versions, since a logged state and the batch's change at its position are one state.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

import pyarrow as pa
from deltalake import Field, QueryBuilder, write_deltalake

from changelake.changelog import KIND, RowKind
from changelake.connectors.delta_sink import ApplyResult, MergeCounts
from changelake.connectors.delta_sink_kernel import _micros, align_to_table
from changelake.connectors.delta_sink_merge import datafusion_null_safe_equal, key_predicate
from changelake.connectors.delta_sink_merge import double_quote as quote
from changelake.connectors.delta_sink_rs import DeltaRsSink
from changelake.connectors.delta_sink_schema import (
    CREATED_DEFAULTS,
    DELETED_AT_TYPE,
    PROP_HISTORY,
    PROP_SCHEMA_POSITION,
    PROP_TRACK_HISTORY,
    stored_fields,
    table_properties,
    tombstone_properties,
)
from changelake.connectors.history_kernel import (
    END_AT,
    INTERVAL_FIELDS,
    START_AT,
    keys_of,
    log_schema,
    rebuild_history,
    rows_of_keys,
)
from changelake.errors import SinkCommitError

log = logging.getLogger(__name__)

#: Column of the state log holding when the state was logged (it expires tombstone_retention later).
LOGGED_AT = "_logged_at"


def history_properties(track_history: tuple[str, ...] | None) -> dict[str, str]:
    """The table properties that say a table is a history table, and which columns it tracks."""
    props = {PROP_HISTORY: "scd2"}
    if track_history is not None:
        props[PROP_TRACK_HISTORY] = json.dumps(list(track_history))
    return props


class DeltaRsHistorySink(DeltaRsSink):
    """SCD type 2 history table written with delta-rs."""

    def _apply_once(self, changes: pa.Table, batch_id: int, truncate_at: str | None = None,
                    dropped_columns: tuple[str, ...] = (), schema_position: str | None = None
                    ) -> tuple[ApplyResult, MergeCounts | None]:
        spec = self.spec
        if truncate_at is not None:
            raise SinkCommitError(f"table {spec.name} is a history table (history: scd2), which does not apply "
                                  "truncates; set the source's on_truncate to skip or fail")
        self._prepare_history_table(changes.schema, schema_position)
        begun = self._begin(changes.schema, batch_id, None, dropped_columns, schema_position)   # replay, schema
        if isinstance(begun, ApplyResult):
            return begun, None
        if begun.skip:
            changes = changes.drop_columns([c for c in begun.skip if c in changes.column_names])
        target_schema = begun.target_schema

        aligned = align_to_table(changes, target_schema)
        keys = keys_of(aligned, spec.primary_key)
        stored = self._read_rows(spec.path, keys, target_schema)
        log_state = self._tombstone_state()         # the state log lives where an upsert table's tombstones do
        wanted_log = pa.schema([*log_schema(target_schema), pa.field(LOGGED_AT, DELETED_AT_TYPE)])
        if log_state is not None:
            missing = [f for f in wanted_log if f.name not in log_state.schema.names]
            if missing:
                self._log(self.tombstone_path).alter.add_columns([Field.from_arrow(f) for f in missing])
                log_state = self._require_state(self.tombstone_path)
        logged = (self._read_rows(self.tombstone_path, keys, log_schema(target_schema))
                  if log_state is not None else log_schema(target_schema).empty_table())
        diff = rebuild_history(aligned, stored, logged, primary_key=spec.primary_key,
                               target_schema=target_schema, track_history=spec.track_history,
                               placeholder=spec.unavailable_value)

        if diff.log.num_rows:
            if log_state is None:
                self._create_table(wanted_log, properties=tombstone_properties(spec.primary_key, spec.path),
                                   path=self.tombstone_path, partition_by=())
                log_state = self._require_state(self.tombstone_path)
            if log_state.txn_version is None or log_state.txn_version < batch_id:
                stamp = pa.array([_micros(self._clock())] * diff.log.num_rows, pa.int64()).cast(DELETED_AT_TYPE)
                rows = diff.log.append_column(pa.field(LOGGED_AT, DELETED_AT_TYPE), stamp)
                write_deltalake(self._log(self.tombstone_path), _cast_to(rows, log_state.schema),
                                mode="append", commit_properties=self._commit(batch_id))

        counts = self._merge_versions(diff.writes, batch_id=batch_id)
        result = ApplyResult(committed=True, upserts=diff.opened + diff.updated, deletes=diff.removed,
                             stale_ignored=0, resurrections_prevented=0, table_version=counts.version)
        return result, counts

    def _prepare_history_table(self, schema: pa.Schema, schema_position: str | None = None) -> None:
        """Create the table with its interval columns and history properties (and the position of the
        schema it is created with), or check (once) that an existing one tracks the declared columns; the
        rest of the contract is the upsert table's."""
        spec = self.spec
        state = self._state(spec.path)
        wanted = history_properties(spec.track_history)
        fields = stored_fields(schema)
        if state is None:
            missing = [c for c in (*spec.partition_by, *(spec.track_history or ()))
                       if c not in [f.name for f in fields]]
            if missing:
                raise SinkCommitError(f"cannot create history table {spec.path}: the batch has no column(s) "
                                      f"{missing} named by partition_by / track_history; fix the table's config")
            self._create_table(pa.schema([f.with_nullable(True) for f in fields] + list(INTERVAL_FIELDS)),
                               properties={**CREATED_DEFAULTS, **spec.properties, **wanted,
                                           **({PROP_SCHEMA_POSITION: schema_position} if schema_position else {}),
                                           **table_properties(spec.primary_key, self.tombstone_path)})
            self._require_state(spec.path)
        elif not self._contract_checked and state.properties.get(PROP_HISTORY) == "scd2":
            recorded = state.properties.get(PROP_TRACK_HISTORY)
            if recorded != wanted.get(PROP_TRACK_HISTORY):
                raise SinkCommitError(
                    f"history table {spec.path} tracks {recorded or 'every column'} but the pipeline declares "
                    f"track_history {wanted.get(PROP_TRACK_HISTORY) or 'unset (every column)'}; the versions "
                    "already written were cut by the recorded columns: restore the setting or write to a new table")

    def _read_rows(self, path: str, keys: pa.Table, schema: pa.Schema) -> pa.Table:
        """The rows of the batch's keys in the table at ``path`` (the versions, or the log), as ``schema``."""
        sql = "SELECT * FROM t"
        single = self.spec.primary_key[0] if len(self.spec.primary_key) == 1 else None
        if single is not None and 0 < keys.num_rows <= 10_000 and keys[single].null_count == 0:
            literals = _literals(keys[single])
            if literals is not None:
                sql += f" WHERE {quote(single)} IN ({literals})"
        found = pa.table(QueryBuilder().register("t", self._log(path)).execute(sql))
        found = _cast_to(found, schema) if found.num_rows else schema.empty_table()
        return rows_of_keys(found, keys, self.spec.primary_key)

    def _delete_tombstones_before(self, cutoff: datetime) -> int:
        stats = self._log(self.tombstone_path).delete(f"{quote(LOGGED_AT)} < '{cutoff.isoformat()}'")
        return int(stats.get("num_deleted_rows", 0))

    def _merge_versions(self, writes: pa.Table, *, batch_id: int) -> MergeCounts:
        """MERGE ON key AND __start_at: -D deletes the version, +I/+U inserts or replaces it; one commit
        with the txn, even when nothing changes."""
        table = self._log(self.spec.path)
        before = table.version()
        inserted = updated = deleted = 0
        if writes.num_rows:
            columns = [c for c in writes.column_names if c != KIND]
            on = key_predicate(self.spec.primary_key, quote, nullable=self._nullable_key_types(writes),
                               null_safe_equal=datafusion_null_safe_equal)
            on += f" AND t.{quote(START_AT)} = s.{quote(START_AT)}"
            values = {quote(c): f"s.{quote(c)}" for c in columns}
            is_delete = f"s.{KIND} = {int(RowKind.DELETE)}"
            stats = (table.merge(writes, on, source_alias="s", target_alias="t", streamed_exec=True,
                                 commit_properties=self._commit(batch_id))
                     .when_matched_delete(predicate=is_delete)
                     .when_matched_update(values, predicate=f"NOT ({is_delete})")
                     .when_not_matched_insert(values, predicate=f"NOT ({is_delete})")
                     .execute())
            inserted = stats["num_target_rows_inserted"]
            updated = stats["num_target_rows_updated"]
            deleted = stats["num_target_rows_deleted"]
        return self._recorded(table, before, batch_id, MergeCounts(inserted=inserted, updated=updated,
                                                                     deleted=deleted, version=before))


def _cast_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns named by ``schema``, cast to it (delta-rs reads text as string views); NULL
    where ``table`` lacks a column."""
    return pa.Table.from_arrays(
        [table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
         for f in schema], schema=schema)


def _literals(column: pa.ChunkedArray) -> str | None:
    """The values of an integer or text key column as a DataFusion SQL list; None for other types."""
    if pa.types.is_integer(column.type):
        return ", ".join(str(v) for v in column.to_pylist())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return ", ".join("'" + v.replace("'", "''") + "'" for v in column.to_pylist())
    return None


__all__ = ["DeltaRsHistorySink", "END_AT", "START_AT", "history_properties"]
