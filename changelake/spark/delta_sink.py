"""delta-spark engine of the Delta upsert sink: the MERGE runs distributed on Spark.

Needs the Delta jars (``io.delta:delta-spark_2.13:4.4.1``) on the Spark classpath and
the session configured with ``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension``
(``open_sink`` checks both). The batch is reduced on the driver in Arrow by the
same kernel as the delta-rs engine (it arrives there as a ``pyarrow.Table``);
the reduced changes become a DataFrame and Delta's MERGE joins them with the
table on the executors.

Exactly-once: every commit runs with ``spark.databricks.delta.write.txnAppId`` /
``txnVersion`` set, in a private child session (``spark.newSession()``) so that
the session-wide settings never leak into other writes of the application.
The recorded version is read back through delta-rs (a log-only read; see
``DeltaUpsertSink``), so ``TableSpec.storage_options`` must let delta-rs reach the
table too (environment credentials work for both).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from changelake.changelog import KIND, SEQ
from changelake.connectors.delta_sink import (
    DELTA_SPARK_CATALOG,
    DELTA_SPARK_CLASS,
    DELTA_SPARK_EXTENSION,
    DELTA_SPARK_PACKAGE,
    DeltaUpsertSink,
    Engine,
    MergeCounts,
    TableSpec,
)
from changelake.connectors.delta_sink import open_sink as open_rs_sink
from changelake.connectors.delta_sink_merge import (
    MergeClauses,
    backtick,
    spark_null_safe_equal,
    table_merge,
    tombstone_merge,
)
from changelake.connectors.delta_sink_schema import DELETED_AT
from changelake.errors import ConfigError

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def expired_before(cutoff: datetime) -> str:
    """Spark SQL predicate selecting tombstones committed before ``cutoff``."""
    return f"{backtick(DELETED_AT)} < timestamp'{cutoff.isoformat()}'"


class DeltaSparkSink(DeltaUpsertSink):
    """Upsert sink that commits through delta-spark's ``DeltaTable.merge``."""

    engine = "delta-spark"

    def __init__(self, spec, *, pipeline_id: str, spark: Any, clock: Callable[[], datetime],
                 max_commit_retries: int) -> None:
        super().__init__(spec, pipeline_id=pipeline_id, clock=clock, max_commit_retries=max_commit_retries)
        self._session = spark.newSession()
        self._txn_lock = threading.Lock()

    # --- helpers -------------------------------------------------------------------

    def _delta(self, path: str):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self._session, path)

    def _frame(self, table: pa.Table):
        schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=True)
        return self._session.createDataFrame(table, schema=schema)

    @contextmanager
    def _txn(self, batch_id: int) -> Iterator[None]:
        """Run the enclosed commit with this sink's Delta transaction id."""
        with self._txn_lock:
            conf = self._session.conf
            conf.set(TXN_APP_ID_CONF, self.app_id)
            conf.set(TXN_VERSION_CONF, str(batch_id))
            try:
                yield
            finally:
                conf.unset(TXN_APP_ID_CONF)
                conf.unset(TXN_VERSION_CONF)

    def _metrics_of_commit(self, path: str, version: int) -> Mapping[str, str]:
        """``operationMetrics`` of commit ``version`` of the table at ``path``."""
        row = (self._delta(path).history(1).where(f"version = {int(version)}")
               .select("operationMetrics").first())
        return (row.operationMetrics or {}) if row is not None else {}

    # --- engine I/O ------------------------------------------------------------------

    def _create_table(self, schema: pa.Schema, *, properties: Mapping[str, str], path: str | None = None,
                      partition_by: tuple[str, ...] | None = None) -> None:
        from delta.tables import DeltaTable

        parts = self.spec.partition_by if partition_by is None else partition_by
        builder = (DeltaTable.createIfNotExists(self._session)
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
        frame = self._session.read.format("delta").load(target)
        (frame.select(*[col(backtick(f.name)).cast(f.dataType).alias(f.name) for f in struct.fields])
         .write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(*parts)
         .save(target))

    def _read_tombstones(self) -> pa.Table:
        columns = [*self.spec.primary_key, SEQ]
        return (self._session.read.format("delta").load(self.tombstone_path)
                .select(*[backtick(c) for c in columns]).toArrow())

    def _merge(self, path: str, changes: pa.Table, clauses: MergeClauses, batch_id: int) -> None:
        with self._txn(batch_id):
            (self._delta(path).alias("t")
             .merge(self._frame(changes).alias("s"), clauses.on)
             .whenMatchedUpdate(condition=clauses.update_when, set=dict(clauses.update_set))
             .whenMatchedDelete(condition=clauses.delete_when)
             .whenNotMatchedInsert(condition=clauses.insert_when, values=dict(clauses.insert_values))
             .execute())

    def _merge_tombstones(self, changes: pa.Table, *, batch_id: int) -> None:
        clauses = tombstone_merge(self.spec.primary_key, backtick, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=spark_null_safe_equal)
        self._merge(self.tombstone_path, changes, clauses, batch_id)

    def _merge_table(self, changes: pa.Table, *, batch_id: int, unavailable: Mapping[str, str] = {}) -> MergeCounts:
        path = self.spec.path
        before = self._require_state(path).version
        if changes.num_rows:
            columns = [c for c in changes.column_names if c != KIND]
            clauses = table_merge(self.spec.primary_key, columns, backtick, nullable=self._nullable_key_types(changes),
                                  null_safe_equal=spark_null_safe_equal, unavailable=unavailable)
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
        conf = self._session.conf
        with self._txn_lock:        # a retention below delta's 7-day floor is the user's explicit choice
            conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            try:
                self._delta(path).vacuum(retention.total_seconds() / 3600)
            finally:
                conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        return 0                    # delta-spark's Python vacuum() does not say how many files it deleted

    def _is_conflict(self, exc: BaseException) -> bool:
        from delta import exceptions as delta_exceptions

        return isinstance(exc, tuple(getattr(delta_exceptions, name) for name in delta_exceptions.__all__))


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
              clock: Callable[[], datetime] | None = None, max_commit_retries: int = 3) -> DeltaUpsertSink:
    """Open the sink for one table.

    ``engine="auto"`` picks delta-spark when ``spark`` is given and the Delta jars and
    session extension are present in it, else delta-rs. ``clock`` returns the
    current UTC time (tombstone timestamps and expiry; tests inject one).
    """
    if engine not in ("auto", "delta-rs", "delta-spark"):
        raise ConfigError(f"unknown sink engine {engine!r}; expected auto, delta-rs or delta-spark")
    if engine in ("auto", "delta-spark"):
        missing = delta_spark_missing(spark)
        if missing is None:
            return DeltaSparkSink(spec, pipeline_id=pipeline_id, spark=spark,
                                  clock=clock or (lambda: datetime.now(timezone.utc)),
                                  max_commit_retries=max_commit_retries)
        if engine == "delta-spark":
            raise ConfigError(f"sink engine delta-spark is not available: {missing}. Start Spark with "
                              f"--packages {DELTA_SPARK_PACKAGE}, spark.sql.extensions={DELTA_SPARK_EXTENSION} "
                              f"and spark.sql.catalog.spark_catalog={DELTA_SPARK_CATALOG}, or use engine delta-rs")
        if spark is not None:
            log.info("table %s: using delta-rs (delta-spark unavailable: %s)", spec.name, missing)
    return open_rs_sink(spec, pipeline_id=pipeline_id, engine="delta-rs", clock=clock,
                        max_commit_retries=max_commit_retries)
