"""The Delta upsert sinks opened with a Spark session: the delta-spark engine, and batches as DataFrames.

``DeltaSparkSink`` (engine delta-spark): the MERGE runs distributed on Spark.
``DeltaRsFrameSink`` (engine delta-rs with a Spark session): ``apply`` as ``DeltaRsSink``, plus
``apply_frame``: a batch given as a DataFrame is reduced on the executors (one change per key) and
only the reduced rows are collected for delta-rs's MERGE.

delta-spark needs the Delta jars (the ``delta`` JVM set: ``io.delta:delta-spark_4.2_2.13:4.4.0``,
put there by changelake/spark/session.py) on the Spark classpath and the session configured with
``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension`` (``open_sink`` checks both). Two ways in:

- ``apply(pyarrow.Table)``: a batch already on the driver is reduced there in Arrow by the same
  kernel as the delta-rs engine; the reduced changes become a DataFrame for the MERGE.
- ``apply_frame(DataFrame)``: the batch stays on the executors. The kernel's DataFrame form
  (:mod:`changelake.spark.delta_sink_frames`) reduces it and splits it against the tombstone table
  (read as a DataFrame), and Delta's MERGE joins the result with the table; only the counts
  (validation, truncate, resurrections prevented, stale deletes, rows sent) reach the driver, in
  one-row aggregations. The tombstone table is read pinned at its current version, so that the
  tombstone MERGE's commit (after which Delta re-caches plans reading the latest table) leaves the
  cached reduction alone. Each step's Spark jobs carry its name (``described``: the Spark UI).

Exactly-once: every commit runs with ``spark.databricks.delta.write.txnAppId`` /
``txnVersion`` set, in a private child session (``spark.newSession()``) so that
the session-wide settings never leak into other writes of the application: one for the sink
table and one for its tombstone table, since ``apply_frame`` runs the two MERGEs at the same time
(the tombstone MERGE in a thread of its own: Delta's planning, log replay and commit of one fill the
driver's idle time in the other's Spark jobs). A crash can then leave the table's commit without
the tombstones': the replay finds that and records them (``commits_alongside``, the table in
:mod:`changelake.connectors.delta_sink`'s docstring).
The recorded version is read back through delta-rs (a log-only read; see
``DeltaUpsertSink``), so ``TableSpec.storage_options`` must let delta-rs reach the
table too (environment credentials work for both).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from changelake.changelog import KIND, SEQ, commit_position
from changelake.connectors.delta_sink import (
    DELTA_SPARK_CATALOG,
    DELTA_SPARK_CLASS,
    DELTA_SPARK_EXTENSION,
    DELTA_SPARK_PACKAGE,
    ApplyResult,
    DeltaUpsertSink,
    Engine,
    MergeCounts,
    TableSpec,
    _Begun,
    _TableState,
    delta_spark_refusal,
    delta_spark_refused_columns,
)
from changelake.connectors.delta_sink import open_sink as open_rs_sink
from changelake.connectors.delta_sink_rs import DeltaRsSink
from changelake.connectors.delta_sink_kernel import align_to_table, placeholder_value
from changelake.connectors.delta_sink_merge import sql_literal
from changelake.connectors.delta_sink_merge import (
    MergeClauses,
    backtick,
    spark_null_safe_equal,
    table_merge,
    tombstone_merge,
)
from changelake.connectors.delta_sink_schema import DELETED_AT
from changelake import metrics
from changelake.errors import ConfigError, SinkCommitError
from changelake.spark import delta_sink_frames as frames

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


JOB_DESCRIPTION = "spark.job.description"


@contextmanager
def described(spark: Any, table: str, phase: str) -> Iterator[None]:
    """The enclosed Spark jobs described as ``changelake <table>: <phase>`` (first line; the
    description they had, such as the streaming query's, below it): the Spark UI's and the event
    log's name for each step of a sink's batch (bench/spark_timing.py ``batch_jobs`` lists them)."""
    context = spark.sparkContext
    before = context.getLocalProperty(JOB_DESCRIPTION)
    mine = f"changelake {table}: {phase}"
    context.setLocalProperty(JOB_DESCRIPTION, mine if not before else f"{mine}\n{before}")
    try:
        yield
    finally:
        context.setLocalProperty(JOB_DESCRIPTION, before)


def beside(work: Callable[[], None]) -> Callable[[], None]:
    """Start ``work`` in a thread of its own, with this thread's Spark local properties (its jobs belong to
    the same streaming batch and carry its description); returns the function that waits for it to end and
    raises its error, if any."""
    from pyspark import InheritableThread

    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the waiting thread, which raises it
            failed.append(exc)

    thread = InheritableThread(target=run, name="changelake-tombstone-merge", daemon=True)
    thread.start()

    def finish() -> None:
        thread.join()
        if failed:
            raise failed[0]

    return finish


def expired_before(cutoff: datetime) -> str:
    """Spark SQL predicate selecting tombstones committed before ``cutoff``."""
    return f"{backtick(DELETED_AT)} < timestamp'{cutoff.isoformat()}'"


class FrameBatches:
    """``apply_frame`` of the upsert sinks opened with a Spark session: a batch that is a Spark DataFrame.

    The DataFrame form of the kernel (:mod:`changelake.spark.delta_sink_frames`) validates and reduces
    it on the executors, after the same ``_begin`` as ``apply`` (replay check, table creation, schema
    changes, truncate); the engine's ``_apply_reduced_frame`` writes the reduced batch (one change per
    key). Exactly once per (pipeline id, table, batch id), as ``apply``.
    """

    spec: TableSpec

    def apply_frame(self, changes: Any, *, batch_id: int, truncate_at: str | None = None,
                    dropped_columns: Sequence[str] = (), schema_position: str | None = None,
                    checks: frames.FrameChecks | None = None) -> ApplyResult:
        """``apply`` for a batch that is a Spark DataFrame (the changelog columns, ``_kind``, ``_seq``).

        The batch's order (``_seq`` ties: the rows of one message) is read from the DataFrame's
        partitions: give it as computed, before any shuffle. ``checks``: its rows per kind and NULLs,
        when counted already (the query counts them with the kinds: no aggregation of its own here).
        """
        if batch_id < 0:
            raise ValueError(f"batch_id must be >= 0, got {batch_id}")
        spec = self.spec
        changes = frames.with_position(changes)
        spark = changes.sparkSession
        with described(spark, spec.name, "validate"):
            frames.validate_frame(changes, primary_key=spec.primary_key, nullable_key=spec.nullable_key,
                                  table=spec.name, checks=checks)
        dropped = tuple(dropped_columns)
        version = commit_position(batch_id, self.generation)
        with described(spark, spec.name, "apply"):
            return self._committing(batch_id, lambda: self._apply_frame_once(changes, version, truncate_at, dropped,
                                                                             schema_position),
                                    freshness=lambda committed_at: self._frame_freshness(changes, committed_at))

    def _frame_freshness(self, changes: Any, committed_at: float) -> None:
        """``changelake_table_freshness_seconds`` of a committed DataFrame batch: counted per bucket on the
        executors (the batch is cached there), as the Arrow batches' are on the driver."""
        with described(changes.sparkSession, self.spec.name, "freshness"):
            counted = frames.freshness_counts(changes, committed_at=committed_at, bounds=metrics.FRESHNESS.bounds)
        if counted is not None:
            metrics.FRESHNESS.observe_counts(self.spec.name, *counted)

    def _apply_frame_once(self, changes: Any, batch_id: int, truncate_at: str | None,
                          dropped_columns: tuple[str, ...], schema_position: str | None = None
                          ) -> tuple[ApplyResult, MergeCounts | None]:
        spec = self.spec
        begun = self._begin(_arrow(changes.drop(frames.POSITION).schema), batch_id, truncate_at,
                            dropped_columns, schema_position)
        if isinstance(begun, ApplyResult):
            return begun, None
        if begun.skip:
            changes = changes.drop(*[c for c in begun.skip if c in changes.columns])
        with described(changes.sparkSession, spec.name, "reduce (truncate count)"):
            reduced, before_truncate = frames.reduce_batch(
                changes, primary_key=spec.primary_key, placeholder=spec.unavailable_value, horizon=begun.horizon,
                target_schema=begun.target_schema, table=spec.name)
        return self._apply_reduced_frame(reduced, begun, batch_id, before_truncate=before_truncate)


class DeltaRsFrameSink(FrameBatches, DeltaRsSink):
    """The delta-rs engine with ``apply_frame``: the batch is reduced on the executors, and only its
    reduced rows (at most one per key) are collected and merged by delta-rs on the driver. The
    driver then holds a batch's distinct keys, not its changes (``storage.reduce_on: executors``)."""

    def _apply_reduced_frame(self, reduced: Any, begun: _Begun, batch_id: int, *,
                             before_truncate: int) -> tuple[ApplyResult, MergeCounts]:
        rows = align_to_table(reduced.toArrow(), begun.target_schema)
        return self._apply_reduced(rows, begun, batch_id, before_truncate=before_truncate)


class DeltaSparkSink(FrameBatches, DeltaUpsertSink):
    """Upsert sink that commits through delta-spark's ``DeltaTable.merge``."""

    engine = "delta-spark"
    commits_alongside = True

    def __init__(self, spec, *, pipeline_id: str, spark: Any, clock: Callable[[], datetime],
                 max_commit_retries: int, generation: int = 0) -> None:
        super().__init__(spec, pipeline_id=pipeline_id, clock=clock, max_commit_retries=max_commit_retries,
                         generation=generation)
        self._session = spark.newSession()          # the sink table's commits and reads
        self._tomb_session = spark.newSession()     # the tombstone table's: its MERGE runs beside the table's
        self._txn_lock = threading.Lock()           # settings of self._session made for one step
        self._tomb_lock = threading.Lock()

    def _apply_reduced_frame(self, reduced: Any, begun: _Begun, batch_id: int, *,
                             before_truncate: int) -> tuple[ApplyResult, MergeCounts]:
        """Split the reduced batch against the tombstone table (read as a DataFrame) and MERGE both,
        on the executors, at the same time (the tombstone MERGE in a thread of its own); only the counts
        reach the driver (one one-row aggregation). Both MERGEs read the split cached, against the
        tombstones before this batch, so neither reads what the other writes."""
        spec = self.spec
        tomb_state = self._tombstone_state()
        tombstones = None if tomb_state is None else self._tombstone_frame(tomb_state)
        split = frames.split_against_tombstones(reduced, tombstones, primary_key=spec.primary_key, now=self._clock())
        split.flagged.persist()             # on the executors: read by the counts and both MERGEs
        try:
            with described(self._session, spec.name, "reduce and split (counts)"):
                counted = frames.split_counts(split)

            def merge_tombstones() -> None:
                with described(self._tomb_session, spec.name, "tombstone MERGE"):
                    self._merge_tombstones_once(split.tombstone_changes, tomb_state, begun.target_schema, batch_id)

            if begun.tombstones_only:
                if counted.tombstone_changes:
                    merge_tombstones()
                return self._tombstones_recorded(batch_id), None
            finish = beside(merge_tombstones) if counted.tombstone_changes else (lambda: None)
            try:
                source = split.table_changes
                unavailable = {}
                if spec.unavailable_value is not None:
                    schema = _arrow(source.schema)
                    unavailable = {c: sql_literal(placeholder_value(schema.field(c).type, spec.unavailable_value))
                                   for c in frames.text_columns(source)}
                with described(self._session, spec.name, "table MERGE"):
                    counts = self._merge_table(source, batch_id=batch_id, unavailable=unavailable,
                                               empty=counted.table_changes == 0, replace=begun.replace)
            except BaseException:
                try:
                    finish()            # the table MERGE's error is raised; the tombstones' is only logged
                except Exception:
                    log.warning("table %s batch %d: the tombstone MERGE failed as well", spec.name, batch_id,
                                exc_info=True)
                raise
            finish()
        finally:
            split.flagged.unpersist()
        return self._result(counts, upserts_sent=counted.table_changes - counted.table_deletes,
                            stale_deletes=counted.stale_deletes,
                            resurrections_prevented=counted.resurrections_prevented,
                            truncated=begun.truncated, before_truncate=before_truncate), counts

    def _tombstone_frame(self, tomb_state: _TableState) -> Any:
        """The tombstones (key columns, ``_seq``) at the version ``tomb_state`` read, pinned, as a DataFrame;
        None when that version holds none (the split then needs no join).

        ===========================================  =================================================
        the tombstone table's version                read as
        ===========================================  =================================================
        no live file, or only files of 0 rows        None
        plain files (reader version 1, relative      the parquet files delta-rs lists, with the schema
        paths, no glob character)                    delta-rs reads: no Spark job to plan it
        anything else                                Delta's read ``versionAsOf`` that version
        ===========================================  =================================================

        Both are pinned: after the tombstone MERGE commits, Delta re-caches every cached plan reading the
        latest tombstone table, which would recompute the whole reduction for the table MERGE. Delta plans
        a version's read by reconstructing its snapshot with Spark jobs (4 per batch, as each batch commits
        a new version); delta-rs has already read that log in-process."""
        columns = [*self.spec.primary_key, SEQ]
        adds = self._log(self.tombstone_path).get_add_actions(flatten=True)
        records = adds.column("num_records").to_pylist() if adds.num_rows else []
        if all(n == 0 for n in records):
            return None
        files = _plain_files(self.tombstone_path, adds.column("path").to_pylist(),
                             self._log(self.tombstone_path).protocol().min_reader_version)
        if files is None:
            return (self._session.read.format("delta").option("versionAsOf", tomb_state.version)
                    .load(self.tombstone_path).select(*[backtick(c) for c in columns]))
        schema = from_arrow_schema(pa.schema([tomb_state.schema.field(c) for c in columns]),
                                   prefer_timestamp_ntz=True)
        # Spark lists more than `threshold` paths in a Spark job of its own: these are files, checked on the driver
        threshold = "spark.sql.sources.parallelPartitionDiscovery.threshold"
        with self._txn_lock:
            given = self._session.conf.get(threshold, None)
            self._session.conf.set(threshold, str(max(len(files), int(given or 32))))
            try:
                return self._session.read.schema(schema).parquet(*files)
            finally:
                if given is None:
                    self._session.conf.unset(threshold)
                else:
                    self._session.conf.set(threshold, given)

    # --- helpers -------------------------------------------------------------------

    def _delta(self, path: str):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self._session_of(path), path)

    def _session_of(self, path: str) -> Any:
        """The private session that writes ``path``: the tombstone table's own, or the sink table's. A
        tombstone table written in the sink table's session while its MERGE has the txn settings set
        would record the batch's txn (and the tombstone MERGE would then be skipped as a replay)."""
        return self._tomb_session if path == self.tombstone_path else self._session

    def _lock_of(self, session: Any) -> threading.Lock:
        """The lock held while a step sets ``session``'s settings for itself."""
        return self._tomb_lock if session is self._tomb_session else self._txn_lock

    @staticmethod
    def _arrow_schema(changes) -> pa.Schema:
        return changes.schema if isinstance(changes, pa.Table) else _arrow(changes.schema)

    def _frame(self, table):
        if not isinstance(table, pa.Table):
            return table                    # a DataFrame already (apply_frame)
        schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=True)
        return self._session.createDataFrame(table, schema=schema)

    @contextmanager
    def _txn(self, batch_id: int, path: str) -> Iterator[None]:
        """Run the enclosed commit to ``path`` with this sink's Delta transaction id."""
        session = self._session_of(path)
        with self._lock_of(session):
            conf = session.conf
            conf.set(TXN_APP_ID_CONF, self.app_id)
            conf.set(TXN_VERSION_CONF, str(batch_id))
            try:
                yield
            finally:
                conf.unset(TXN_APP_ID_CONF)
                conf.unset(TXN_VERSION_CONF)

    def _metrics_of_commit(self, path: str, version: int) -> Mapping[str, str]:
        """``operationMetrics`` of commit ``version`` of the table at ``path``, read from the log by delta-rs
        (delta-spark's ``history()`` costs Spark jobs for one JSON line)."""
        latest = self._require_state(path).version
        for commit in self._log(path).history(max(1, latest - int(version) + 1)):
            if commit.get("version") == int(version):
                return {k: str(v) for k, v in (commit.get("operationMetrics") or {}).items()}
        return {}

    # --- engine I/O ------------------------------------------------------------------

    def _create_table(self, schema: pa.Schema, *, properties: Mapping[str, str], path: str | None = None,
                      partition_by: tuple[str, ...] | None = None) -> None:
        from delta.tables import DeltaTable

        refused = delta_spark_refused_columns(schema.names)
        if refused:
            raise SinkCommitError(delta_spark_refusal(self.spec.name, refused))
        parts = self.spec.partition_by if partition_by is None else partition_by
        builder = (DeltaTable.createIfNotExists(self._session_of(path or self.spec.path))
                   .location(path or self.spec.path)
                   .addColumns(from_arrow_schema(schema, prefer_timestamp_ntz=True)))
        if parts:
            builder = builder.partitionedBy(*parts)
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()

    def _add_columns(self, fields: list[pa.Field]) -> None:
        struct = from_arrow_schema(pa.schema(fields), prefer_timestamp_ntz=True)
        columns = ", ".join(f"{backtick(f.name)} {f.dataType.simpleString()}" for f in struct.fields)
        self._session.sql(f"ALTER TABLE delta.{backtick(self.spec.path)} ADD COLUMNS ({columns})")

    def _rewrite_table(self, schema: pa.Schema, *, path: str | None = None) -> None:
        from pyspark.sql.functions import col

        target = path or self.spec.path
        struct = from_arrow_schema(schema, prefer_timestamp_ntz=True)
        parts = self._require_state(target).partition_columns
        frame = self._session_of(target).read.format("delta").load(target)
        (frame.select(*[col(backtick(f.name)).cast(f.dataType).alias(f.name) for f in struct.fields])
         .write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(*parts)
         .save(target))

    def _read_tombstones(self) -> pa.Table:
        columns = [*self.spec.primary_key, SEQ]
        return (self._tomb_session.read.format("delta").load(self.tombstone_path)
                .select(*[backtick(c) for c in columns]).toArrow())

    def _merge(self, path: str, changes: pa.Table, clauses: MergeClauses, batch_id: int) -> None:
        with self._txn(batch_id, path):
            merge = (self._delta(path).alias("t")
                     .merge(self._frame(changes).alias("s"), clauses.on)
                     .whenMatchedUpdate(condition=clauses.update_when, set=dict(clauses.update_set))
                     .whenMatchedDelete(condition=clauses.delete_when)
                     .whenNotMatchedInsert(condition=clauses.insert_when, values=dict(clauses.insert_values)))
            if clauses.delete_unmatched:
                merge = merge.whenNotMatchedBySourceDelete()
            merge.execute()

    def _merge_tombstones(self, changes: pa.Table, *, batch_id: int) -> None:
        clauses = tombstone_merge(self.spec.primary_key, backtick, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=spark_null_safe_equal)
        self._merge(self.tombstone_path, changes, clauses, batch_id)

    def _merge_table(self, changes, *, batch_id: int, unavailable: Mapping[str, str] = {},
                     empty: bool | None = None, replace: bool = False) -> MergeCounts:
        path = self.spec.path
        before = self._require_state(path).version
        if replace or not (changes.num_rows == 0 if empty is None else empty):
            columns = [c for c in self._arrow_schema(changes).names if c != KIND]
            clauses = table_merge(self.spec.primary_key, columns, backtick, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=spark_null_safe_equal, unavailable=unavailable, replace=replace)
            self._merge(path, changes, clauses, batch_id)
        state = self._require_state(path)
        stats = self._metrics_of_commit(path, state.version) if state.version > before else {}
        if state.txn_version != batch_id:
            # Nothing was committed (an empty or all-stale batch): record the txn with an
            # empty idempotent append, so that a replay of this batch is recognised.
            (self._frame(state.schema.empty_table()).write.format("delta").mode("append")
             .option("txnAppId", self.app_id).option("txnVersion", batch_id).save(path))
            state = self._require_state(path)
        return MergeCounts(inserted=int(stats.get("numTargetRowsInserted", 0)),
                           updated=int(stats.get("numTargetRowsUpdated", 0)),
                           deleted=int(stats.get("numTargetRowsDeleted", 0)),
                           version=state.version)

    def _delete_tombstones_before(self, cutoff: datetime) -> int:
        before = self._require_state(self.tombstone_path).version
        self._delta(self.tombstone_path).delete(expired_before(cutoff))
        after = self._require_state(self.tombstone_path).version
        if after == before:
            return 0
        return int(self._metrics_of_commit(self.tombstone_path, after).get("numDeletedRows", 0))

    def _compact_tombstones(self) -> None:
        self._delta(self.tombstone_path).optimize().executeCompaction()

    def _seq_column(self) -> str:
        return backtick(SEQ)

    def _set_properties(self, properties: Mapping[str, str]) -> None:
        assignments = ", ".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in properties.items())
        self._session.sql(f"ALTER TABLE delta.{backtick(self.spec.path)} SET TBLPROPERTIES ({assignments})")

    def _delete_where(self, predicate: str) -> int:
        before = self._require_state(self.spec.path).version
        self._delta(self.spec.path).delete(predicate)
        after = self._require_state(self.spec.path).version
        if after == before:
            return 0
        return int(self._metrics_of_commit(self.spec.path, after).get("numDeletedRows", 0))

    def _any_row(self, predicate: str) -> bool:
        return bool(self._session.read.format("delta").load(self.spec.path).where(predicate).limit(1).count())

    def _compact_table(self) -> None:
        self._delta(self.spec.path).optimize().executeCompaction()

    def _vacuum(self, path: str, retention: timedelta) -> int:
        session = self._session_of(path)
        conf = session.conf
        # Delta lists the table's directories in as many tasks as parallelPartitionDiscovery.parallelism
        # (Spark's default: 10,000, one minute of empty tasks on 2 cores per table): one per task slot
        listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
        given = conf.get(listing, None)
        with self._lock_of(session):    # a retention below delta's 7-day floor is the user's explicit choice
            conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            if given is None:
                conf.set(listing, str(max(1, session.sparkContext.defaultParallelism)))
            try:
                before = self._data_files(path)
                self._delta(path).vacuum(retention.total_seconds() / 3600)
            finally:
                conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
                if given is None:
                    conf.unset(listing)
        # delta-spark's vacuum() does not say how many files it deleted: count them, as delta-rs reports
        return max(0, before - self._data_files(path))

    def _data_files(self, path: str) -> int:
        """Files under the table's directory outside ``_delta_log`` (data, deletion vectors, change data),
        listed through Hadoop's FileSystem: what VACUUM may delete, on any store delta-spark writes."""
        hadoop_fs = self._session._jvm.org.apache.hadoop.fs
        table = hadoop_fs.Path(path)
        fs = table.getFileSystem(self._session._jsc.hadoopConfiguration())
        if not fs.exists(table):
            return 0
        log_dir = hadoop_fs.Path(table, "_delta_log")
        in_log = fs.getContentSummary(log_dir).getFileCount() if fs.exists(log_dir) else 0
        return int(fs.getContentSummary(table).getFileCount()) - int(in_log)

    def _is_conflict(self, exc: BaseException) -> bool:
        from delta import exceptions as delta_exceptions

        return isinstance(exc, tuple(getattr(delta_exceptions, name) for name in delta_exceptions.__all__))


_GLOB = frozenset("*?[]{}\\")


def _plain_files(table: str, paths: Sequence[str], reader_version: int) -> list[str] | None:
    """The data files of a Delta table version as paths Spark's parquet reader takes (``table``: the
    table's path as Spark is given it, ``paths``: its add actions' paths); None when the files alone are
    not the version's rows (a reader feature such as deletion vectors or column mapping) or a path is
    not one Spark would read literally (absolute, or with a glob character)."""
    if reader_version > 1:
        return None
    files = [table.rstrip("/") + "/" + unquote(p) for p in paths]
    if any("://" in p or p.startswith("/") for p in paths) or any(_GLOB & set(f) for f in files):
        return None
    return files


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- opening ---------------------------------------------------------------------


def delta_spark_missing(spark: Any) -> str | None:
    """Why the delta-spark engine cannot run in ``spark`` (None when it can)."""
    if spark is None:
        return "no Spark session was given"
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return "the Spark session has no JVM gateway (Spark Connect); the delta-spark engine needs classic PySpark"
    from py4j.protocol import Py4JJavaError

    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_SPARK_CLASS, False, loader)
    except Py4JJavaError:  # wraps java.lang.ClassNotFoundException
        return (f"{DELTA_SPARK_PACKAGE} jars are not on the Spark classpath "
                f"({DELTA_SPARK_CLASS} is not loadable)")
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_SPARK_EXTENSION not in extensions:
        return f"spark.sql.extensions does not include {DELTA_SPARK_EXTENSION}"
    if spark.conf.get("spark.sql.catalog.spark_catalog", "") != DELTA_SPARK_CATALOG:
        return f"spark.sql.catalog.spark_catalog is not {DELTA_SPARK_CATALOG}"
    return None


def open_sink(spec: TableSpec, *, pipeline_id: str, engine: Engine = "auto", spark: Any = None,
              clock: Callable[[], datetime] | None = None, max_commit_retries: int = 3,
              generation: int = 0) -> DeltaUpsertSink:
    """Open the sink for one table.

    ``engine="auto"`` picks delta-spark when ``spark`` runs on a cluster manager (not a ``local``
    or ``local-cluster`` master: there the batch's rows never pass through the driver) and the
    Delta jars and session extension are present in it, else delta-rs (on one machine delta-rs
    writes a batch faster; docs/sink.md, "Engines"). With ``spark``, an upsert table's sink
    (either engine) also takes DataFrames (``apply_frame``). ``clock`` returns the
    current UTC time (tombstone timestamps and expiry; tests inject one). ``generation``: the running
    checkpoint's generation (``DeltaUpsertSink``).
    """
    if engine not in ("auto", "delta-rs", "delta-spark"):
        raise ConfigError(f"unknown sink engine {engine!r}; expected auto, delta-rs or delta-spark")
    if spec.history is not None:
        # a history batch is rebuilt on the driver from the keys' stored versions and merged from there:
        # delta-rs writes it whatever the engine (both write the same Delta protocol)
        if engine == "delta-spark":
            log.info("table %s: history tables are written with delta-rs (engine delta-spark applies to "
                     "upsert tables)", spec.name)
        return open_rs_sink(spec, pipeline_id=pipeline_id, engine="delta-rs", clock=clock,
                            max_commit_retries=max_commit_retries, generation=generation)
    if engine == "auto" and spark is not None and _local_master(spark):
        engine = "delta-rs"
    if engine in ("auto", "delta-spark"):
        missing = delta_spark_missing(spark)
        if missing is None:
            return DeltaSparkSink(spec, pipeline_id=pipeline_id, spark=spark,
                                  clock=clock or (lambda: datetime.now(timezone.utc)),
                                  max_commit_retries=max_commit_retries, generation=generation)
        if engine == "delta-spark":
            raise ConfigError(f"sink engine delta-spark is not available: {missing}. Install the jars "
                              f"(`python -m changelake.jvm_deps install delta`: the session builder then loads "
                              f"them), or under spark-submit pass them with --jars and set "
                              f"spark.sql.extensions={DELTA_SPARK_EXTENSION} and "
                              f"spark.sql.catalog.spark_catalog={DELTA_SPARK_CATALOG}; or use engine delta-rs")
        if spark is not None:
            log.info("table %s: using delta-rs (delta-spark unavailable: %s)", spec.name, missing)
    if spark is None:
        return open_rs_sink(spec, pipeline_id=pipeline_id, engine="delta-rs", clock=clock,
                            max_commit_retries=max_commit_retries, generation=generation)
    # delta-rs with a Spark session: ``apply`` as without one, and ``apply_frame`` for batches reduced on Spark
    return DeltaRsFrameSink(spec, pipeline_id=pipeline_id, clock=clock or (lambda: datetime.now(timezone.utc)),
                            max_commit_retries=max_commit_retries, generation=generation)


def _local_master(spark: Any) -> bool:
    """True when ``spark`` runs on one machine (``local[...]`` or ``local-cluster[...]``)."""
    return str(spark.sparkContext.master).startswith("local")


def _arrow(schema: Any) -> pa.Schema:
    """A DataFrame's schema in Arrow (timestamps with a time zone in UTC, as the sink stores them)."""
    return to_arrow_schema(schema, timezone="UTC")
