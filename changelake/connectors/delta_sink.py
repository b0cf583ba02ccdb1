"""Delta upsert sink: merges changelog batches into a Delta table by primary key.

One :class:`DeltaUpsertSink` per target table, opened with :func:`open_sink` and
called once per micro-batch from Spark's ``foreachBatch`` on the driver::

    sink = open_sink(TableSpec(name="orders", path="s3://lake/orders", primary_key=("id",)),
                     pipeline_id="orders-cdc", spark=spark)
    result = sink.apply(changes, batch_id=batch_id)

Per batch (see ``docs/sink.md``); v = the batch's commit position (checkpoint generation, batch id;
``changelog.commit_position``), the transaction version of both commits::

    the table's recorded txn (app_id) against v (``connectors.commits``): the batch is there -> skip:
        committed=False (a replay after a restart); the table is ahead of the checkpoint -> refuse
    create the table / add new nullable columns when needed
    a view's table (replace_on_new_generation) written by an older checkpoint generation: this batch's
        MERGE also deletes every row it does not hold (the new checkpoint's views start from nothing)
    a truncate newer than the table's -> record its position, delete the rows older than it
    drop changes older than the table's truncate position (delta_sink_kernel)
    reduce to the latest change per key (delta_sink_kernel)
    split against tombstones  -> tombstone MERGE (txn app_id, batch_id), skipped if already recorded
                              -> table MERGE guarded by target._seq < source._seq (txn app_id, batch_id)
    every tombstone_expiry_interval: delete tombstones older than tombstone_retention
    maintenance (TableSpec.maintenance), after both commits, never between a batch's data and its txn:
        every compact_every, when the table has > compact_min_files live files: compact (OPTIMIZE)
        every vacuum_every: VACUUM the table and its tombstone table, keeping vacuum_retention

When each of those last ran is recorded with every commit (``changelake.maintenance`` in the commit's
metadata, delta-rs engine) and read back from the table's latest commits by a sink's first batch: a
restarted pipeline keeps the schedule instead of running every step in its first batch, which had added
seconds to the restart's first commit on an object store (docs/sink.md, "Maintenance"). A table whose
recent commits carry no schedule (another writer's, an older changelake, the delta-spark engine): every
step is due, as before.

The tombstone commit comes first (an engine with ``commits_alongside`` makes both at once): what a
crash leaves, and what the replay of the batch does (the split depends only on the batch and the
tombstone table, never on the sink table, so a replay that finds the tombstone table unchanged splits
the batch as the first run did)::

    neither commit            both MERGEs, as the first run
    the tombstone commit      the tombstone MERGE skipped (its txn is recorded), the table MERGE; a
                              delete whose _seq equals its tombstone's is still applied
    the table commit          only with commits_alongside: the batch is reduced and split again and
                              only the tombstone MERGE runs (committed=False). Skipping the batch
                              there would lose its tombstones: a late, older insert of a key the
                              batch deleted would bring the row back
    both                      nothing written (committed=False)

Without ``commits_alongside`` the table commit alone cannot happen, so a replay that finds the
table's txn skips the batch without reading it.

A commit the object store fails for a while (HTTP 5xx, throttling, timeouts, refused connections:
:func:`is_transient_store_error`) is tried again, from a fresh read of the table's log, with a backoff of
1 s doubling to 30 s, for up to :data:`STORE_RETRY_S` (5 minutes) since its first such failure: delta-rs's
own client gives up after 10 quick retries (a few seconds), far shorter than a store's brownout. A try
whose reply was lost after the store applied it finds the batch's transaction id on the next try and
writes nothing twice (``connectors.commits``).
"""

from __future__ import annotations

import abc
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import ClassVar, Literal

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from changelake.changelog import KIND, SEQ, SOURCE_TS, commit_position, split_commit_position
from changelake.connectors.commits import check_position, describe
from changelake.connectors.delta_log import LogRead, TxnVersions, read_commit
from changelake.connectors.object_store import STORE_RETRY_S, StoreBrownout, arrow_filesystem
from changelake.connectors.delta_sink_kernel import (
    align_to_table,
    apply_tombstone_changes,
    check_truncate_order,
    count_deletes,
    drop_before_truncate,
    fill_unavailable,
    placeholder_value,
    unavailable_columns,
    without_views,
    kafka_partition_prefix,
    latest_per_key,
    split_against_tombstones,
    truncate_order_error,
    validate_changes,
)
from changelake.connectors.delta_sink_merge import sql_literal
from changelake.connectors.delta_sink_schema import (
    CREATED_DEFAULTS,
    PROP_SCHEMA_POSITION,
    PROP_TRUNCATED_BEFORE,
    SchemaPlan,
    check_table_contract,
    check_tombstone_contract,
    default_tombstone_path,
    schema_plan,
    stored_fields,
    table_properties,
    tombstone_properties,
    tombstone_schema,
)
from changelake.errors import ConfigError, SinkCommitError
from changelake import metrics

__all__ = ["ApplyResult", "DeltaUpsertSink", "Engine", "Maintenance", "TableSpec", "open_sink"]

log = logging.getLogger(__name__)

Engine = Literal["auto", "delta-rs", "delta-spark"]

#: The JVM class whose presence means the Delta jars are on the Spark classpath.
DELTA_SPARK_CLASS = "io.delta.tables.DeltaTable"
DELTA_SPARK_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"   # the `delta` JVM set (jvm/pom.xml)
DELTA_SPARK_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_SPARK_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: characters delta-spark refuses in a column name without column mapping (delta-rs writes them)
DELTA_SPARK_INVALID_NAME_CHARS = " ,;{}()\n\t="


def delta_spark_refused_columns(names: Sequence[str]) -> list[str]:
    """The column names that Delta Lake for Spark refuses (without column mapping, which changelake does
    not enable) and delta-rs writes: checked at ``validate`` for declared columns and at table creation."""
    return [n for n in names if any(c in n for c in DELTA_SPARK_INVALID_NAME_CHARS)]


#: Delta's defaults of the two retentions Delta for Spark compares (delta-rs does not compare them)
_RETENTION_DEFAULTS = {"delta.logRetentionDuration": "interval 30 days",
                       "delta.deletedFileRetentionDuration": "interval 1 week"}
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def delta_spark_refused_properties(properties: Mapping[str, str]) -> str | None:
    """Why Delta for Spark refuses a table with these properties and delta-rs does not (None: it takes them):
    ``delta.logRetentionDuration`` shorter than ``delta.deletedFileRetentionDuration`` (a reader of an old
    version would find its files vacuumed). Intervals Delta reads but this does not (months) are not judged."""
    seconds = {}
    for key, default in _RETENTION_DEFAULTS.items():
        m = _INTERVAL.match(properties.get(key, default))
        if m is None:
            return None
        seconds[key] = int(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
    log_key, files_key = _RETENTION_DEFAULTS
    if seconds[log_key] >= seconds[files_key]:
        return None
    return (f"the delta-spark engine refuses {log_key} ({properties.get(log_key, _RETENTION_DEFAULTS[log_key])}) "
            f"shorter than {files_key} ({properties.get(files_key, _RETENTION_DEFAULTS[files_key])}): Delta for "
            f"Spark requires the log to outlive the files; lengthen the one or shorten the other, or use "
            f"storage.engine: delta-rs")


def delta_spark_refusal(table: str, names: Sequence[str]) -> str:
    """Why the delta-spark engine cannot write ``names`` of ``table``, and the ways out."""
    return (f"table {table}: the delta-spark engine cannot write the column(s) {', '.join(repr(n) for n in names)}: "
            f"Delta Lake for Spark refuses a space or any of ',;{{}}()=' and tabs or newlines in a column name "
            f"unless column mapping is on, which changelake does not enable; rename the column(s) (in the source, "
            f"or in the view that names them), or use storage.engine: delta-rs")


@dataclass(frozen=True)
class Maintenance:
    """When the sink compacts and vacuums a table (None: never). Compaction rewrites small files
    into large ones in a commit that changes no row (dataChange=false), so readers see the same
    rows; VACUUM deletes files that left the table more than ``vacuum_retention`` ago, so a reader
    still on an older snapshot than that, or time travel that far back, fails."""

    compact_every: timedelta | None = timedelta(minutes=15)
    compact_min_files: int = 32
    vacuum_every: timedelta | None = timedelta(days=1)
    vacuum_retention: timedelta = timedelta(days=7)


@dataclass(frozen=True)
class TableSpec:
    """One target table of the sink.

    ``tombstone_path`` defaults to ``<parent of path>/_changelake_tombstones/<last segment of path>``.
    ``storage_options`` are object-store options in delta-rs form (``AWS_REGION``, ...).
    ``nullable_key``: the key columns that may hold NULL, NULL then being one key value (the
    planner's ``nullable_key`` of a graph table keyed by a group or partition key that may be
    NULL); a NULL in any other key column fails the batch. ``unavailable_value``: the placeholder a
    connector writes for a value it did not send; a change holding it keeps the stored value.
    """

    name: str
    path: str
    primary_key: tuple[str, ...]
    partition_by: tuple[str, ...] = ()
    tombstone_retention: timedelta = timedelta(days=7)
    storage_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    tombstone_path: str | None = None
    tombstone_expiry_interval: timedelta = timedelta(hours=1)
    nullable_key: tuple[str, ...] = ()
    unavailable_value: str | None = None
    maintenance: Maintenance = Maintenance()
    #: Delta table properties the user asks for (e.g. delta.enableChangeDataFeed); set at creation and
    #: on an existing table whose values differ
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    #: "scd2": keep every version of each key (``connectors/delta_history.py``); None: upsert the latest
    history: Literal["scd2"] | None = None
    #: history tables: the columns whose changes open a new version (None: every column); changes to
    #: the others update the current version in place
    track_history: tuple[str, ...] | None = None
    #: what the table does when its source's columns change (``delta_sink_schema`` module doc)
    schema_change: str = "lenient"
    #: a view's table: the first commit of a newer checkpoint generation replaces its rows (the new
    #: checkpoint's operators start empty, so their output is the whole view; rows it lacks are stale)
    replace_on_new_generation: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.primary_key, str) or not self.primary_key:
            raise ConfigError(f"table {self.name}: primary_key must be a non-empty tuple of column names")
        if isinstance(self.partition_by, str):
            raise ConfigError(f"table {self.name}: partition_by must be a tuple of column names")
        # accept lists from config files; the spec stays immutable and hashable
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "nullable_key", tuple(self.nullable_key))
        strangers = [c for c in self.nullable_key if c not in self.primary_key]
        if strangers:
            raise ConfigError(f"table {self.name}: nullable_key names column(s) {strangers} outside the primary key "
                              f"{list(self.primary_key)}")
        object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        own = sorted(k for k in self.properties if k.startswith("changelake."))
        if own:
            raise ConfigError(f"table {self.name}: properties {own} are the sink's own; remove them")
        reserved = [c for c in (*self.primary_key, *self.partition_by) if c.startswith("_")]
        if reserved:
            raise ConfigError(f"table {self.name}: key and partition columns cannot be reserved "
                              f"(names starting with '_'): {reserved}")
        if self.tombstone_retention <= timedelta(0):
            raise ConfigError(f"table {self.name}: tombstone_retention must be positive")
        if self.history not in (None, "scd2"):
            raise ConfigError(f"table {self.name}: history must be scd2 or unset, got {self.history!r}")
        if self.replace_on_new_generation and self.history is not None:
            raise ConfigError(f"table {self.name}: a history table keeps its versions; it is not replaced")
        if self.track_history is not None:
            if self.history is None:
                raise ConfigError(f"table {self.name}: track_history applies to history tables; add history: scd2")
            object.__setattr__(self, "track_history", tuple(self.track_history))
            bad = [c for c in self.track_history if c.startswith("_") or c in self.primary_key]
            if bad:
                raise ConfigError(f"table {self.name}: track_history lists key or reserved column(s) {bad}; "
                                  "list the non-key columns whose changes open a new version")

    @property
    def resolved_tombstone_path(self) -> str:
        return self.tombstone_path or default_tombstone_path(self.path)


@dataclass(frozen=True)
class ApplyResult:
    """What one :meth:`DeltaUpsertSink.apply` did to the table.

    ``committed`` is False only when the batch id was already committed (a replay).
    ``upserts``: rows inserted or updated; ``deletes``: rows removed;
    ``stale_ignored``: changes not newer than what the table (or a tombstone) holds;
    ``resurrections_prevented``: inserts/updates older than the key's tombstone;
    ``truncated``: rows a truncate of this batch removed; ``before_truncate``: changes older than the
    table's latest truncate, dropped (also counted in ``stale_ignored``).
    """

    committed: bool
    upserts: int
    deletes: int
    stale_ignored: int
    resurrections_prevented: int
    table_version: int | None
    truncated: int = 0
    before_truncate: int = 0


@dataclass(frozen=True)
class MergeCounts:
    """Rows a table MERGE changed, from the engine's merge metrics."""

    inserted: int
    updated: int
    deleted: int
    version: int


@dataclass(frozen=True)
class _Begun:
    """A batch's table, ready for its rows: the schema to align them to, and the truncate's outcome."""

    target_schema: pa.Schema
    truncated: int                 # rows a truncate of this batch deleted
    horizon: str | None            # the table's truncate position: older changes are dropped
    skip: tuple[str, ...] = ()     # batch columns not written (schema_change: ignored or dropped columns)
    replace: bool = False          # the MERGE also deletes the rows the batch does not hold
    tombstones_only: bool = False  # the table holds the batch, its tombstone table may not: only that MERGE


@dataclass(frozen=True)
class _TableState:
    schema: pa.Schema
    properties: Mapping[str, str]
    partition_columns: tuple[str, ...]
    txn_version: int | None
    version: int


def source_times(changes: pa.Table) -> pa.Array | None:
    """The changes' source times (``_source_ts``) as epoch milliseconds, None when they carry none."""
    if SOURCE_TS not in changes.column_names or changes.num_rows == 0:
        return None
    column = changes.column(SOURCE_TS).combine_chunks()
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    return column.drop_null() if column.null_count else column


def record_freshness(table: str, source_ts: pa.Array | None, *, now: float | None = None) -> None:
    """``changelake_table_freshness_seconds``: a committed change's commit time minus its source time."""
    if source_ts is None or len(source_ts) == 0:
        return
    committed_ms = (time.time() if now is None else now) * 1000.0
    seconds = (committed_ms - source_ts.to_numpy(zero_copy_only=False).astype("float64")) / 1000.0
    metrics.FRESHNESS.observe_many(table, seconds.clip(min=0.0))


class DeltaUpsertSink(abc.ABC):
    """Upsert-by-primary-key sink for one Delta table; the engine subclasses do the I/O.

    Transaction state, schema and properties are read through delta-rs for both
    engines (a log-only read); data is read and written by the engine. ``generation``: the running
    checkpoint's generation (``changelake.service.lifecycle``); the engine methods' ``batch_id`` is the
    batch's commit position (``changelog.commit_position``), the transaction version they record.
    """

    engine: ClassVar[str]
    #: the engine may commit a batch's tombstone MERGE and table MERGE at the same time (module docstring:
    #: a replay then checks the tombstone table as well)
    commits_alongside: ClassVar[bool] = False
    #: the engine reads its tombstone copy as ``delta_sink_rs.read_tombstone_keys`` does (:meth:`adopt_logs`)
    tombstones_read_by_delta_rs: ClassVar[bool] = False

    def __init__(self, spec: TableSpec, *, pipeline_id: str, clock: Callable[[], datetime],
                 max_commit_retries: int, generation: int = 0) -> None:
        if not pipeline_id:
            raise ConfigError("pipeline_id must be non-empty: it keys the sink's exactly-once commits")
        self.spec = spec
        self.pipeline_id = pipeline_id
        self.app_id = f"changelake:{pipeline_id}:{spec.name}"
        self.generation = generation
        self.tombstone_path = spec.resolved_tombstone_path
        self._clock = clock
        self._max_commit_retries = max_commit_retries
        #: see :data:`STORE_RETRY_S`
        self._store_retry_s = STORE_RETRY_S
        self._last_expiry: datetime | None = None
        self._last_compact: datetime | None = None
        self._last_vacuum: datetime | None = None
        self._schedule_read = False     # the recorded maintenance schedule taken up (first batch)
        self._contract_checked = False
        self._tombstone_contract_checked = False
        self._logs: dict[str, DeltaTable] = {}
        self._txns = TxnVersions(self.app_id, spec.storage_options)
        #: (tombstone table version, its key columns and _seq): :meth:`_tombstones`
        self._tomb_copy: tuple[int, pa.Table] | None = None
        #: recorded with the batch's commit (delta-rs engine): the source position the table is consistent to
        #: (``changelake.consistency``), set by the pipeline before each batch
        self.commit_metadata: dict[str, str] = {}

    # --- public -----------------------------------------------------------------

    def apply(self, changes: pa.Table, *, batch_id: int, truncate_at: str | None = None,
              dropped_columns: Sequence[str] = (), schema_position: str | None = None) -> ApplyResult:
        """Merge one changelog batch; exactly once per (pipeline id, table, checkpoint generation, batch id).

        ``truncate_at``: the position (``_seq``) of the latest truncate of the table read in this batch
        (``on_truncate: apply``): rows and changes older than it go, newer ones apply.
        ``dropped_columns``: table columns the source's schema no longer has (``TableSpec.schema_change``
        says what happens to them). ``schema_position``: the source position of the schema the batch's
        columns follow; recorded (property ``changelake.schemaPosition``) when the table is created or its
        columns change, before they change (``changelake.connectors.schema_positions``).
        """
        if batch_id < 0:
            raise ValueError(f"batch_id must be >= 0, got {batch_id}")
        if truncate_at is not None and changes.num_rows == 0 and \
                any(k not in changes.column_names for k in self.spec.primary_key):
            # a truncate alone, from a source whose columns are not known yet in this process
            state = self._state(self.spec.path)
            if state is None:
                log.info("table %s: truncate at %s of a table not written yet: nothing to empty",
                         self.spec.name, truncate_at)
                return ApplyResult(committed=True, upserts=0, deletes=0, stale_ignored=0,
                                   resurrections_prevented=0, table_version=None)
            changes = state.schema.empty_table().append_column(KIND, pa.array([], pa.int8()))
        changes = validate_changes(changes, primary_key=self.spec.primary_key, table=self.spec.name,
                                   nullable_key=self.spec.nullable_key)
        dropped = tuple(dropped_columns)
        version = commit_position(batch_id, self.generation)
        source_ts = source_times(changes)
        return self._committing(batch_id, lambda: self._apply_once(changes, version, truncate_at, dropped,
                                                                   schema_position),
                                freshness=lambda committed_at: record_freshness(self.spec.name, source_ts,
                                                                                now=committed_at))

    def _committing(self, batch_id: int, once: Callable[[], tuple[ApplyResult, MergeCounts | None]], *,
                    freshness: Callable[[float], None] | None = None) -> ApplyResult:
        """Run ``once`` (one attempt at committing the batch), retrying concurrent-write conflicts;
        count and time the commit, record the freshness of its changes (``freshness(commit time)``, epoch
        seconds: ``changelake_table_freshness_seconds``), then run the maintenance that is due."""
        started = time.perf_counter()
        attempt = 0
        brownout = StoreBrownout(self._store_retry_s)
        while True:
            try:
                result, counts = once()
                break
            except Exception as exc:  # classified below and always re-raised, typed
                wait = None if self._is_conflict(exc) else brownout.delay(exc)
                if wait is not None:
                    metrics.COMMIT_RETRIES.labels(table=self.spec.name).inc()
                    log.warning("table %s batch %d: the store failed the commit (%s); trying again in %.0f s "
                                "(for up to %.0f s)", self.spec.name, batch_id, str(exc).splitlines()[0],
                                wait, self._store_retry_s)
                    self._forget_logs()
                    brownout.sleep(wait)
                    continue
                if self._is_conflict(exc) and attempt < self._max_commit_retries:
                    attempt += 1
                    metrics.COMMIT_RETRIES.labels(table=self.spec.name).inc()
                    log.warning("table %s batch %d: concurrent write conflict, retry %d: %s",
                                self.spec.name, batch_id, attempt, exc)
                    self._forget_logs()
                    self._contract_checked = False      # another job may have changed the schema
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    continue
                metrics.COMMIT_FAILURES.labels(table=self.spec.name).inc()
                if isinstance(exc, SinkCommitError):
                    raise
                raise SinkCommitError(
                    f"{self.engine} commit of batch {batch_id} to {self.spec.path} failed"
                    f"{' after ' + str(attempt) + ' retries' if attempt else ''}: {exc}") from exc
        if counts is not None:
            metrics.COMMIT_SECONDS.labels(table=self.spec.name, engine=self.engine).observe(
                time.perf_counter() - started)
            committed_at = time.time()
            self._record_metrics(result, counts)
            if freshness is not None:
                try:
                    freshness(committed_at)
                except Exception as exc:    # the batch is committed: a metric must not fail it
                    log.warning("table %s batch %d: freshness not recorded: %s", self.spec.name, batch_id, exc)
            self._maintain()
        return result

    def expire_tombstones(self, *, now: datetime | None = None) -> int:
        """Delete tombstones older than ``tombstone_retention`` and compact the tombstone table.

        Returns how many tombstones were removed. ``apply`` calls this every
        ``tombstone_expiry_interval``; call it directly to expire on another schedule.
        """
        now = now or self._clock()
        self._last_expiry = now
        if self._state(self.tombstone_path) is None:
            return 0
        removed = self._delete_tombstones_before(now - self.spec.tombstone_retention)
        self._compact_tombstones()
        return removed

    def table_version(self) -> int | None:
        """Latest version of the sink table, or None before the first commit."""
        state = self._state(self.spec.path)
        return None if state is None else state.version

    def committed_batch_id(self) -> int | None:
        """Greatest batch id of this sink's checkpoint generation committed to the table, or None (also
        when another generation wrote last: :meth:`committed_position`)."""
        position = self.committed_position()
        if position is None:
            return None
        generation, batch = split_commit_position(position)
        return batch if generation == self.generation else None

    def committed_position(self) -> int | None:
        """The commit position (``changelog.commit_position``) the table last recorded for this pipeline."""
        state = self._state(self.spec.path)
        return None if state is None else state.txn_version

    # --- the flow ----------------------------------------------------------------

    def _apply_once(self, changes: pa.Table, batch_id: int, truncate_at: str | None = None,
                    dropped_columns: tuple[str, ...] = (), schema_position: str | None = None
                    ) -> tuple[ApplyResult, MergeCounts | None]:
        begun = self._begin(changes.schema, batch_id, truncate_at, dropped_columns, schema_position)
        if isinstance(begun, ApplyResult):
            return begun, None
        if begun.skip:
            changes = changes.drop_columns([c for c in begun.skip if c in changes.column_names])
        spec = self.spec
        changes, before_truncate = drop_before_truncate(changes, begun.horizon)
        changes = fill_unavailable(changes, primary_key=spec.primary_key, placeholder=spec.unavailable_value)
        reduced = align_to_table(latest_per_key(changes, primary_key=spec.primary_key), begun.target_schema)
        return self._apply_reduced(reduced, begun, batch_id, before_truncate=before_truncate)

    def _apply_reduced(self, reduced: pa.Table, begun: "_Begun", batch_id: int, *,
                       before_truncate: int) -> tuple[ApplyResult, MergeCounts]:
        """The rest of a batch once it is reduced to one change per key and aligned to the table: the
        split against the tombstones, the tombstone MERGE, the table MERGE (Arrow, on the driver)."""
        spec = self.spec
        now = self._clock()
        tomb_state = self._tombstone_state()
        tombstones = self._tombstones(tomb_state)
        split = split_against_tombstones(reduced, tombstones, primary_key=spec.primary_key, now=now)

        if split.tombstone_changes.num_rows:
            self._merge_tombstones_once(split.tombstone_changes, tomb_state, begun.target_schema, batch_id)
            self._keep_tombstones(tomb_state, split.tombstone_changes)
        if begun.tombstones_only:
            return self._tombstones_recorded(batch_id), None
        source = split.table_changes
        unavailable = {c: sql_literal(placeholder_value(source.schema.field(c).type, spec.unavailable_value))
                       for c in unavailable_columns(source, spec.unavailable_value)}
        counts = self._merge_table(source, batch_id=batch_id, unavailable=unavailable, replace=begun.replace)
        n_deletes = count_deletes(source)
        return self._result(counts, upserts_sent=source.num_rows - n_deletes, stale_deletes=split.stale_deletes,
                            resurrections_prevented=split.resurrections_prevented,
                            truncated=begun.truncated, before_truncate=before_truncate), counts

    def _begin(self, schema: pa.Schema, batch_id: int, truncate_at: str | None,
               dropped_columns: tuple[str, ...] = (), schema_position: str | None = None) -> "ApplyResult | _Begun":
        """Everything before the batch's rows are read: the replay check (its result when the batch was
        committed), the table's creation or contract check and schema changes, the truncate."""
        spec = self.spec
        state = self._state(spec.path)
        if not self._schedule_read:
            self._schedule_read = True
            if state is not None:
                self._take_up_schedule()
        generation, batch = split_commit_position(batch_id)
        recorded = None if state is None else state.txn_version
        tombstones_only = False
        if check_position(recorded, generation=generation, batch_id=batch, what=f"table {spec.name}") == "replay":
            if not self._tombstones_behind(batch_id):
                return self._replayed(batch_id, state.version,
                                      "already committed (a replay after a restart), not written again")
            # the table's commit is there, its tombstone table's may not be (module docstring): the batch's
            # schema changes and truncate are in the table already, so the steps below change nothing
            tombstones_only = True
            log.info("table %s: %s already committed to the table, not (or not yet) to its tombstone table: "
                     "splitting the batch again for its tombstones", spec.name, describe(batch_id))
        replace = (spec.replace_on_new_generation and recorded is not None
                   and split_commit_position(recorded)[0] < generation)
        if replace:
            log.info("table %s: written by %s; this checkpoint (generation %d) recomputes the view, so its first "
                     "commit replaces the table's rows", spec.name, describe(recorded), generation)

        fields = stored_fields(schema)
        if state is None:
            missing = [c for c in spec.partition_by if c not in [f.name for f in fields]]
            if missing:
                raise SinkCommitError(f"cannot create table {spec.path} partitioned by {list(spec.partition_by)}: "
                                      f"the batch has no column(s) {missing}; fix partition_by or the pipeline")
            position = {PROP_SCHEMA_POSITION: schema_position} if schema_position is not None else {}
            self._create_table(pa.schema([f.with_nullable(True) for f in fields]),
                               properties={**CREATED_DEFAULTS, **spec.properties, **position,
                                           **table_properties(spec.primary_key, self.tombstone_path)})
            state = self._require_state(spec.path)
        elif not self._contract_checked:
            check_table_contract(path=spec.path, properties=state.properties,
                                 partition_columns=state.partition_columns, schema=state.schema,
                                 primary_key=spec.primary_key, partition_by=spec.partition_by,
                                 history=spec.history)
            changed = {k: v for k, v in spec.properties.items() if state.properties.get(k) != v}
            if changed:
                log.info("table %s: setting table properties %s", spec.name, changed)
                self._set_properties(changed)
                state = self._require_state(spec.path)
        self._contract_checked = True
        plan = schema_plan(path=spec.path, table_schema=state.schema, batch_fields=fields,
                           behaviour=spec.schema_change, dropped=dropped_columns, primary_key=spec.primary_key,
                           partition_by=spec.partition_by)
        if plan.new_fields or plan.rewrites:
            if schema_position is not None and state.properties.get(PROP_SCHEMA_POSITION) != schema_position:
                # first: a replay after a crash between the two finds the position, and the change still to make
                self._set_properties({PROP_SCHEMA_POSITION: schema_position})
                state = self._require_state(spec.path)
            self._change_schema(state, plan)

        truncated, horizon = self._truncate(state, truncate_at)
        return _Begun(target_schema=plan.target_schema, truncated=truncated, horizon=horizon, skip=plan.skip,
                      replace=replace, tombstones_only=tombstones_only)

    def _tombstones_behind(self, batch_id: int) -> bool:
        """Whether a batch the table has recorded may lack its tombstone commit: only when this engine commits
        the two at once and the tombstone table has not recorded the batch (no tombstone table: the batch may
        have been the one to create it). Without tombstone changes the batch made no tombstone commit, so this
        is also true then: the replay finds that by splitting the batch again."""
        if not self.commits_alongside:
            return False
        tomb = self._state(self.tombstone_path)
        return tomb is None or tomb.txn_version is None or tomb.txn_version < batch_id

    def _tombstones(self, tomb_state: "_TableState | None") -> pa.Table:
        """Key columns and ``_seq`` of every tombstone at the tombstone table's version in ``tomb_state``: this
        sink's copy when it was made for that version, else read from the table (and kept).

        The tombstone table grows with every delete until ``tombstone_retention`` (7 days by default); read in
        full for every batch, it made each batch slower than the one before under a steady stream of deletes.
        The copy follows the sink's own tombstone MERGEs (:meth:`_keep_tombstones`); any other commit to the
        table (expiry, compaction, another writer) moves its version, and the next batch reads it again."""
        if tomb_state is None:
            return pa.table({SEQ: pa.array([], pa.string())})
        if self._tomb_copy is not None and self._tomb_copy[0] == tomb_state.version:
            return self._tomb_copy[1]
        tombstones = without_views(self._read_tombstones())
        self._tomb_copy = (tomb_state.version, tombstones)
        return tombstones

    def _keep_tombstones(self, before: "_TableState | None", changes: pa.Table) -> None:
        """After the tombstone MERGE of ``changes``: the copy of the tombstones moved to the table's new version
        when that MERGE was the table's only commit since ``before`` (the version the copy is of); else dropped,
        to be read again with the next batch (a replay whose MERGE was already there, an engine whose MERGE
        this sink's log handle does not see, a commit of another writer in between)."""
        copy, self._tomb_copy = self._tomb_copy, None
        if before is None or copy is None or copy[0] != before.version:
            return
        after = self._log(self.tombstone_path).version()
        if after != before.version + 1:
            return
        try:
            self._tomb_copy = (after, apply_tombstone_changes(copy[1], changes, primary_key=self.spec.primary_key))
        except (pa.ArrowException, ValueError, KeyError):     # read again with the next batch
            log.debug("table %s: tombstones to be read again", self.spec.name, exc_info=True)

    def _tombstone_state(self) -> "_TableState | None":
        """The tombstone table's state (None before its first tombstone), its contract checked once."""
        tomb_state = self._state(self.tombstone_path)
        if tomb_state is not None and not self._tombstone_contract_checked:
            check_tombstone_contract(path=self.tombstone_path, properties=tomb_state.properties,
                                     table_path=self.spec.path)
            self._tombstone_contract_checked = True
        return tomb_state

    def _merge_tombstones_once(self, changes, tomb_state: "_TableState | None", target_schema: pa.Schema,
                               batch_id: int) -> None:
        """Create the tombstone table if needed, then MERGE the batch's tombstone changes unless a
        crash after that commit already recorded this batch."""
        if tomb_state is None:
            self._create_table(tombstone_schema(target_schema, self.spec.primary_key),
                               properties=tombstone_properties(self.spec.primary_key, self.spec.path),
                               path=self.tombstone_path, partition_by=())
            tomb_state = self._require_state(self.tombstone_path)
        if tomb_state.txn_version is None or tomb_state.txn_version < batch_id:
            self._merge_tombstones(changes, batch_id=batch_id)

    def _tombstones_recorded(self, batch_id: int) -> ApplyResult:
        """The result of a replay that found the batch in the table and ran only its tombstone MERGE (if the
        batch had tombstone changes)."""
        return self._replayed(batch_id, self._require_state(self.spec.path).version,
                              "tombstones recorded, the table's commit was there")

    def _replayed(self, batch_id: int, table_version: int, what: str) -> ApplyResult:
        """A replayed batch's result: nothing new in the table (``committed=False``), counted and logged
        (``what`` the replay found or did)."""
        metrics.REPLAYED_BATCHES.labels(table=self.spec.name).inc()
        log.info("table %s: %s %s", self.spec.name, describe(batch_id), what)
        return ApplyResult(committed=False, upserts=0, deletes=0, stale_ignored=0, resurrections_prevented=0,
                           table_version=table_version)

    @staticmethod
    def _result(counts: MergeCounts, *, upserts_sent: int, stale_deletes: int, resurrections_prevented: int,
                truncated: int, before_truncate: int) -> ApplyResult:
        return ApplyResult(
            committed=True,
            upserts=counts.inserted + counts.updated,
            deletes=counts.deleted,
            stale_ignored=(upserts_sent - counts.inserted - counts.updated) + stale_deletes + before_truncate,
            resurrections_prevented=resurrections_prevented,
            table_version=counts.version,
            truncated=truncated,
            before_truncate=before_truncate,
        )

    def _change_schema(self, state: _TableState, plan: SchemaPlan) -> None:
        """Add, widen and drop the table's columns as ``plan`` says; log and count each change. A widened
        or dropped column rewrites the table's files (one commit, no transaction id: a crash before the
        batch's MERGE replays the batch, which finds the table already changed)."""
        before = state.schema
        if plan.rewrites:
            self._rewrite_table(pa.schema([f for f in plan.target_schema if f.name in before.names]))
            if set(self.spec.primary_key) & {f.name for f in plan.widened}:
                tomb = self._state(self.tombstone_path)
                if tomb is not None:
                    self._rewrite_table(tombstone_schema(plan.target_schema, self.spec.primary_key),
                                        path=self.tombstone_path)
            self._forget_logs()
            self._require_state(self.spec.path)
        if plan.new_fields:
            self._add_columns(list(plan.new_fields))
        for change in plan.changes:
            if change.outcome != "apply":
                continue
            old = f"{change.column} {change.old}" if change.old is not None else "-"
            new = f"{change.column} {change.new}" if change.new is not None else "-"
            log.info("table %s: schema change %s: %s -> %s (schema_change: %s)", self.spec.name, change.kind,
                     old, new, self.spec.schema_change)
            metrics.SCHEMA_CHANGES.labels(table=self.spec.name, kind=change.kind).inc()

    def _truncate(self, state: _TableState, truncate_at: str | None) -> tuple[int, str | None]:
        """Apply a truncate newer than the table's: record its position, then delete the rows older than it.

        Returns (rows deleted, the table's truncate position). Neither commit carries the batch's
        transaction id: a crash before the batch's MERGE replays the batch, which finds the position
        recorded and deletes again (nothing, or what a crash left).
        """
        recorded = state.properties.get(PROP_TRUNCATED_BEFORE)
        if truncate_at is None or (recorded is not None and truncate_at <= recorded):
            return 0, recorded
        prefix = kafka_partition_prefix(truncate_at)
        if prefix is not None and self._any_row(f"{self._seq_column()} >= 'k' AND {self._seq_column()} < 'l' AND "
                                                f"substr({self._seq_column()}, 1, 6) <> '{prefix}'"):
            raise SinkCommitError(truncate_order_error(truncate_at, self.spec.name))
        if recorded is not None:
            check_truncate_order(pa.array([recorded]), truncate_at, table=self.spec.name)
        self._set_properties({PROP_TRUNCATED_BEFORE: truncate_at})
        deleted = self._delete_where(f"{self._seq_column()} < '{truncate_at}'")
        log.info("table %s: truncated at position %s, %d row(s) deleted", self.spec.name, truncate_at, deleted)
        self._require_state(self.spec.path)     # the cached log reads the two commits
        return deleted, truncate_at

    def _maintain(self) -> None:
        """Expire tombstones, compact and vacuum when due. Runs after the batch committed, so it never
        fails the batch: an error is logged, counted, and the step is tried again with the next batch."""
        now = self._clock()
        if self._expiry_due(now):
            try:
                removed = self.expire_tombstones(now=now)
            except Exception:  # the batch is committed; tombstones merely live longer
                self._last_expiry = None
                log.warning("table %s: tombstone expiry failed; retrying with the next batch", self.spec.name,
                            exc_info=True)
            else:
                if removed:
                    log.info("table %s: expired %d tombstone(s)", self.spec.name, removed)
        m = self.spec.maintenance
        if m.compact_every is not None and _due(self._last_compact, m.compact_every, now):
            self._last_compact = now
            if self._files(self.spec.path)[0] > m.compact_min_files:
                self._run_maintenance("compact", self.compact)
        if m.vacuum_every is not None and _due(self._last_vacuum, m.vacuum_every, now):
            self._last_vacuum = now
            self._run_maintenance("vacuum", self.vacuum)
        self._record_files()

    def _run_maintenance(self, operation: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:  # the batch is committed; the step is retried when next due
            metrics.MAINTENANCE.labels(table=self.spec.name, operation=operation, result="failed").inc()
            log.warning("table %s: %s failed; retrying when next due", self.spec.name, operation, exc_info=True)
            if operation == "compact":
                self._last_compact = None
            else:
                self._last_vacuum = None
        else:
            metrics.MAINTENANCE.labels(table=self.spec.name, operation=operation, result="ok").inc()

    def compact(self) -> tuple[int, int]:
        """Compact the table's small files now (OPTIMIZE); returns (files before, files after).
        No row changes: the commit is dataChange=false and keeps the table's transaction ids."""
        before = self._files(self.spec.path)[0]
        self._compact_table()
        self._forget_logs()
        after = self._files(self.spec.path)[0]
        log.info("table %s: compacted %d file(s) into %d", self.spec.name, before, after)
        return before, after

    def vacuum(self, retention: timedelta | None = None) -> int:
        """Delete the files the table and its tombstone table stopped using more than ``retention``
        (default ``maintenance.vacuum_retention``) ago; returns how many were deleted."""
        retention = self.spec.maintenance.vacuum_retention if retention is None else retention
        deleted = 0
        for path in (self.spec.path, self.tombstone_path):
            if self._state(path) is not None:
                deleted += self._vacuum(path, retention)
        if deleted:
            log.info("table %s: vacuum deleted %d unused file(s)", self.spec.name, deleted)
        return deleted

    def _files(self, path: str) -> tuple[int, int]:
        """(live files, their bytes) of the table at ``path`` as this sink's handle of its log last saw it
        (the batch's own commits included; loaded when there is none); (0, 0) before it exists. Not brought
        up to date: the file-count metrics and the compaction check need no other writer's last commit, and
        each read of a log on an object store lists it (two per table and batch, on S3 a third of a batch's
        log reads)."""
        if path not in self._logs and self._state(path) is None:
            return 0, 0
        adds = self._log(path).get_add_actions(flatten=True)
        if adds.num_rows == 0:
            return 0, 0
        return adds.num_rows, int(sum(adds.column("size_bytes").to_pylist()))

    def _record_files(self) -> None:
        for label, path in ((self.spec.name, self.spec.path), (f"{self.spec.name} tombstones", self.tombstone_path)):
            try:
                files, size = self._files(path)
            except Exception:  # a metric never fails a batch
                log.debug("table %s: cannot count files", label, exc_info=True)
                continue
            metrics.TABLE_FILES.labels(table=label).set(files)
            metrics.TABLE_BYTES.labels(table=label).set(size)

    def _schedule_metadata(self) -> dict[str, str]:
        """The commit metadata that records when each maintenance step last ran (module docstring)."""
        known = {step: at.isoformat() for step, at in (("expiry", self._last_expiry), ("compact", self._last_compact),
                                                        ("vacuum", self._last_vacuum)) if at is not None}
        return {MAINTENANCE_KEY: json.dumps(known, sort_keys=True)} if known else {}

    def _take_up_schedule(self) -> None:
        """When each maintenance step last ran, from the newest of the table's last few commits that recorded it
        (a steady writer's last batch, usually the newest); none found: every step is due (module docstring)."""
        try:
            recorded = next((info[MAINTENANCE_KEY] for info in self._recent_commit_infos(SCHEDULE_COMMITS)
                             if isinstance(info.get(MAINTENANCE_KEY), str)), None)
        except Exception:  # unknown: the steps are due, as without a record
            log.debug("table %s: maintenance schedule not read", self.spec.name, exc_info=True)
            return
        if recorded is None:
            return
        try:
            times = {step: datetime.fromisoformat(at) for step, at in json.loads(recorded).items()}
        except (ValueError, TypeError, AttributeError):
            log.warning("table %s: its commits record a maintenance schedule this version cannot read (%r); "
                        "every step is due", self.spec.name, recorded)
            return
        now = self._clock()
        self._last_expiry, self._last_compact, self._last_vacuum = (
            None if times.get(step) is None or times[step] > now else times[step]
            for step in ("expiry", "compact", "vacuum"))
        log.debug("table %s: maintenance last ran %s", self.spec.name, recorded)

    def _recent_commit_infos(self, count: int) -> Iterator[dict]:
        """The ``commitInfo`` of the table's newest ``count`` commits, newest first, read from the log's
        files (one GET each on an object store; delta-rs's ``history`` lists the log first)."""
        latest = self._log(self.spec.path).version()
        fs, root = arrow_filesystem(self.spec.path, dict(self.spec.storage_options) or None)
        for version in range(latest, max(-1, latest - count), -1):
            actions = read_commit(fs, root, version)
            if actions is None:       # the log's older entries cleaned up
                return
            for action in actions:
                if isinstance(action.get("commitInfo"), dict):
                    yield action["commitInfo"]

    def _expiry_due(self, now: datetime) -> bool:
        return self._last_expiry is None or now - self._last_expiry >= self.spec.tombstone_expiry_interval

    def _record_metrics(self, result: ApplyResult, counts: MergeCounts) -> None:
        name = self.spec.name
        metrics.ROWS_OUT.labels(table=name, kind="+I").inc(counts.inserted)
        metrics.ROWS_OUT.labels(table=name, kind="+U").inc(counts.updated)
        metrics.ROWS_OUT.labels(table=name, kind="-D").inc(counts.deleted)
        metrics.STALE_CHANGES.labels(table=name).inc(result.stale_ignored)
        metrics.RESURRECTIONS_PREVENTED.labels(table=name).inc(result.resurrections_prevented)
        metrics.TRUNCATED_ROWS.labels(table=name).inc(result.truncated)
        if result.table_version is not None:
            metrics.TABLE_VERSION.labels(table=name).set(result.table_version)

    # --- log reads through delta-rs (both engines) --------------------------------

    def _state(self, path: str) -> _TableState | None:
        table = self._logs.get(path)
        try:
            if table is None:
                table = DeltaTable(path, storage_options=dict(self.spec.storage_options) or None)
                self._logs[path] = table
            else:
                table.update_incremental()
        except TableNotFoundError:
            return None
        meta = table.metadata()
        return _TableState(
            schema=pa.schema(table.schema().to_arrow()),
            properties=dict(meta.configuration),
            partition_columns=tuple(meta.partition_columns),
            txn_version=self._txns.of(path, table),
            version=table.version(),
        )

    def _require_state(self, path: str) -> _TableState:
        state = self._state(path)
        if state is None:
            raise SinkCommitError(f"table {path} is still missing after it was created; check the storage "
                                  "location and its credentials")
        return state

    def adopt_logs(self, reads: Mapping[str, LogRead]) -> None:
        """Take up what another reader loaded of this sink's tables' logs (the start's check and its tombstone
        reads, ``service.lifecycle``), by path: the next read brings each handle up to date
        (``update_incremental``, then only the newer commits: ``delta_log.TxnVersions``) instead of loading
        the whole log again; a tombstone table's keys, read as this engine reads them, are the sink's copy."""
        for path, read in reads.items():
            if path in self._logs or read.app_id != self.app_id:
                continue
            self._logs[path] = read.table
            version = read.table.version()
            self._txns.seed(path, version, read.txn)
            if path == self.tombstone_path and read.tombstones is not None and self.tombstones_read_by_delta_rs \
                    and read.tombstones.column_names == [*self.spec.primary_key, SEQ]:
                self._tomb_copy = (version, read.tombstones)

    def _log(self, path: str) -> DeltaTable:
        """The cached delta-rs handle of ``path`` (call :meth:`_state` first)."""
        return self._logs[path]

    def _forget_logs(self) -> None:
        self._logs.clear()
        self._txns.forget()
        self._tomb_copy = None

    def _nullable_key_types(self, changes: pa.Table) -> dict[str, pa.DataType]:
        """The key columns that may hold NULL, with their types in ``changes``, for the MERGE's ``ON``."""
        return {k: self._arrow_schema(changes).field(k).type for k in self.spec.nullable_key}

    @staticmethod
    def _arrow_schema(changes) -> pa.Schema:
        """The Arrow schema of a batch (an engine may take other tables than Arrow ones)."""
        return changes.schema

    # --- engine I/O -------------------------------------------------------------

    @abc.abstractmethod
    def _create_table(self, schema: pa.Schema, *, properties: Mapping[str, str], path: str | None = None,
                      partition_by: tuple[str, ...] | None = None) -> None:
        """Create a Delta table (the sink table unless ``path`` is given) if it does not exist."""

    @abc.abstractmethod
    def _add_columns(self, fields: list[pa.Field]) -> None:
        """Add nullable columns to the sink table."""

    @abc.abstractmethod
    def _rewrite_table(self, schema: pa.Schema, *, path: str | None = None) -> None:
        """Rewrite the table (the sink table unless ``path`` is given) with exactly the columns of
        ``schema``, each value cast to its type, in one commit that keeps its properties and txns."""

    @abc.abstractmethod
    def _read_tombstones(self) -> pa.Table:
        """Key columns and ``_seq`` of every tombstone."""

    @abc.abstractmethod
    def _merge_tombstones(self, changes: pa.Table, *, batch_id: int) -> None:
        """Record -D rows and clear the tombstones of newer +I/+U rows, in one commit with the txn."""

    @abc.abstractmethod
    def _merge_table(self, changes: pa.Table, *, batch_id: int, unavailable: Mapping[str, str] = {},
                     replace: bool = False) -> MergeCounts:
        """MERGE into the sink table in one commit that records the txn, even when nothing changes
        (``unavailable``: column -> placeholder literal, see ``delta_sink_merge.table_merge``; ``replace``:
        the same commit deletes every row ``changes`` has no key of)."""

    @abc.abstractmethod
    def _delete_tombstones_before(self, cutoff: datetime) -> int:
        """Delete tombstones with ``_deleted_at < cutoff``; return the count."""

    @abc.abstractmethod
    def _compact_tombstones(self) -> None:
        """Rewrite the tombstone table's small files (one is added per batch with deletes)."""

    @abc.abstractmethod
    def _seq_column(self) -> str:
        """The ``_seq`` column quoted for the engine's SQL."""

    @abc.abstractmethod
    def _set_properties(self, properties: Mapping[str, str]) -> None:
        """Set table properties of the sink table (one commit, no transaction id)."""

    @abc.abstractmethod
    def _delete_where(self, predicate: str) -> int:
        """Delete the sink table's rows matching ``predicate`` (one commit, no transaction id); the count."""

    @abc.abstractmethod
    def _any_row(self, predicate: str) -> bool:
        """Whether a row of the sink table matches ``predicate``."""

    @abc.abstractmethod
    def _compact_table(self) -> None:
        """Compact the sink table's small files in a dataChange=false commit."""

    @abc.abstractmethod
    def _vacuum(self, path: str, retention: timedelta) -> int:
        """VACUUM the table at ``path`` keeping ``retention``; return the files deleted."""

    @abc.abstractmethod
    def _is_conflict(self, exc: BaseException) -> bool:
        """True when ``exc`` is a concurrent-write conflict worth retrying."""


#: the commit metadata key of the maintenance schedule (module docstring), and how many of a table's newest
#: commits a first batch reads for it (one GET each on an object store)
MAINTENANCE_KEY = "changelake.maintenance"
SCHEDULE_COMMITS = 5


def _due(last: datetime | None, every: timedelta, now: datetime) -> bool:
    return last is None or now - last >= every


# --- opening ---------------------------------------------------------------------


def open_sink(spec: TableSpec, *, pipeline_id: str, engine: Engine = "auto",
              clock: Callable[[], datetime] | None = None, max_commit_retries: int = 3,
              generation: int = 0) -> DeltaUpsertSink:
    """Open the delta-rs sink for one table (no JVM).

    ``engine`` "auto" and "delta-rs" both mean delta-rs here; the delta-spark engine needs a Spark
    session, so it is opened by :func:`changelake.spark.delta_sink.open_sink`, which chooses between
    the two. ``clock`` returns the current UTC time (tombstone timestamps and expiry; tests inject one).
    ``generation``: the running checkpoint's generation (:class:`DeltaUpsertSink`).
    """
    clock = clock or (lambda: datetime.now(timezone.utc))
    if engine not in ("auto", "delta-rs", "delta-spark"):
        raise ConfigError(f"unknown sink engine {engine!r}; expected auto, delta-rs or delta-spark")
    if engine == "delta-spark":
        raise ConfigError("sink engine delta-spark needs a Spark session: open it with "
                          "changelake.spark.delta_sink.open_sink(spec, spark=...), or use engine delta-rs")
    if spec.history is not None:
        from changelake.connectors.delta_history import DeltaRsHistorySink

        return DeltaRsHistorySink(spec, pipeline_id=pipeline_id, clock=clock, max_commit_retries=max_commit_retries,
                                  generation=generation)
    from changelake.connectors.delta_sink_rs import DeltaRsSink

    return DeltaRsSink(spec, pipeline_id=pipeline_id, clock=clock, max_commit_retries=max_commit_retries,
                       generation=generation)
