"""The Delta sink's per-batch kernel on Spark DataFrames: the batch stays on the executors.

The same rules as the Arrow kernel (:mod:`changelake.connectors.delta_sink_kernel`, whose module
docstring is the specification), written as DataFrame operations, so that the delta-spark engine
reduces and splits a batch where it was computed and hands the result to Delta's MERGE without
collecting it on the driver (:meth:`changelake.spark.delta_sink.DeltaSparkSink.apply_frame`)::

    with_position            the batch order, as a column (ties of one _seq keep their order)
    drop_before_truncate     filter: _seq >= the table's truncate position
    fill_unavailable         window per key by (_seq, position): each placeholder of a +I/+U takes
                             the value of the key's previous +I/+U, NULL after a -D
    latest_per_key           window per key by (_seq, position) descending: the first row, -U dropped
    split_against_tombstones null-safe left join with the tombstones (key, _seq): blocked
                             resurrections and stale deletes out, tombstones to record or clear
    align_to_table           the table's columns, cast, NULL where absent, plus _kind
    reduce_batch             validate_frame, then the above up to align_to_table, in the sink's order
    freshness_counts         after the commit: commit time - _source_ts per histogram bucket (the metric)

Keys group as the MERGE matches them: NULL with NULL (``eqNullSafe``, window partitions), and
Spark normalises NaN and -0.0 in grouping and join keys as the Arrow kernel does. The truncate's
order check and the counts of :class:`changelake.connectors.delta_sink.ApplyResult` are one-row
aggregations (:func:`split_counts`).
``tests/spark/test_delta_sink_frames.py`` checks both kernels give the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import BinaryType, IntegralType, StringType, TimestampNTZType, TimestampType

from changelake.changelog import KIND, SEQ, SOURCE_TS, RowKind
from changelake.connectors.delta_sink_kernel import kafka_partition_prefix, truncate_order_error
from changelake.connectors.delta_sink_schema import DELETED_AT
from changelake.errors import SinkCommitError

POSITION = "__changelake_pos"
_TOMB_SEQ = "__changelake_tomb_seq"
_PREV = "__changelake_prev_"


def with_position(df: DataFrame) -> DataFrame:
    """``df`` with its batch order as a column. Call it before any shuffle: the id grows with the
    partition and the row within it, so the rows of one message (one payload) keep their order."""
    return df.withColumn(POSITION, F.monotonically_increasing_id())


def drop_before_truncate(df: DataFrame, truncated_before: str | None) -> DataFrame:
    """The changes at or after the table's truncate position."""
    if truncated_before is None:
        return df
    return df.where(F.col(SEQ) >= F.lit(truncated_before))


def _key(primary_key: Sequence[str]) -> list[Column]:
    return [F.col(_bt(k)) for k in primary_key]


def _bt(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def text_columns(df: DataFrame) -> list[str]:
    """The user's text and bytes columns: those that may hold an unavailable-value placeholder."""
    return [f.name for f in df.schema.fields
            if not f.name.startswith("_") and isinstance(f.dataType, (StringType, BinaryType))]


def fill_unavailable(df: DataFrame, *, primary_key: Sequence[str], placeholder: str | None) -> DataFrame:
    """Each placeholder of a +I/+U replaced by the value of the key's previous +I/+U in the batch; NULL
    when the key's previous change is a -D; kept (the MERGE keeps the table's value) when there is
    neither. ``-U`` rows are dropped (the reduction drops them anyway). Needs :func:`with_position`."""
    if placeholder is None:
        return df
    columns = text_columns(df)
    if not columns:
        return df
    df = df.where(F.col(KIND) != int(RowKind.UPDATE_BEFORE))
    earlier = (Window.partitionBy(*_key(primary_key)).orderBy(F.col(SEQ), F.col(POSITION))
               .rowsBetween(Window.unboundedPreceding, -1))
    is_delete = F.col(KIND) == int(RowKind.DELETE)
    filled = []
    for name in columns:
        needle = placeholder.encode() if isinstance(df.schema[name].dataType, BinaryType) else placeholder
        col = F.col(_bt(name))
        is_placeholder = F.coalesce(col == F.lit(needle), F.lit(False))
        # what a later placeholder takes: NULL after a -D, the value of a +I/+U that is not a placeholder
        known = (F.when(is_delete, F.struct(F.lit(True).alias("deleted"), F.lit(None).cast(df.schema[name].dataType).alias("v")))
                 .when(~is_placeholder, F.struct(F.lit(False).alias("deleted"), col.alias("v"))))
        prev = F.last(known, ignorenulls=True).over(earlier)
        filled.append(F.when(~is_delete & is_placeholder & prev.isNotNull(),
                             F.when(prev["deleted"], F.lit(None)).otherwise(prev["v"]))
                      .otherwise(col).alias(name))
    others = [F.col(_bt(c)) for c in df.columns if c not in columns]
    return df.select(*others, *filled).select(*[_bt(c) for c in df.columns])


def latest_per_key(df: DataFrame, *, primary_key: Sequence[str]) -> DataFrame:
    """Per key (NULL is one key value), the last change (batch order) of the greatest ``_seq``; ``-U``
    dropped. Needs :func:`with_position`; the result keeps that column."""
    last_first = Window.partitionBy(*_key(primary_key)).orderBy(F.col(SEQ).desc(), F.col(POSITION).desc())
    rank = "__changelake_rank"
    return (df.where(F.col(KIND) != int(RowKind.UPDATE_BEFORE))
            .withColumn(rank, F.row_number().over(last_first))
            .where(F.col(rank) == 1).drop(rank))


@dataclass(frozen=True)
class FrameSplit:
    """A reduced batch split against the key's tombstones (see ``TombstoneSplit``). The counts are
    columns of ``flagged``: :func:`split_counts` computes them in one small action."""

    table_changes: DataFrame       # to MERGE into the sink table
    tombstone_changes: DataFrame   # key, _seq, _kind, _deleted_at: -D to record, +I/+U to clear
    flagged: DataFrame             # the reduced batch with its blocked / stale flags


def split_against_tombstones(reduced: DataFrame, tombstones: DataFrame | None, *, primary_key: Sequence[str],
                             now: datetime) -> FrameSplit:
    """Apply the tombstone rows of the Arrow kernel's table (its module docstring) to a reduced
    batch: one change per key. ``tombstones`` has the key columns and ``_seq`` (None: no table)."""
    if now.tzinfo is None:
        raise ValueError("the sink's clock must return timezone-aware datetimes")
    if tombstones is None:
        joined = reduced.withColumn(_TOMB_SEQ, F.lit(None).cast(StringType()))
    else:
        tomb = tombstones.select(*[F.col(_bt(k)).alias(f"__changelake_tk{i}") for i, k in enumerate(primary_key)],
                                 F.col(SEQ).cast(StringType()).alias(_TOMB_SEQ))
        on = None
        for i, k in enumerate(primary_key):
            cond = reduced[_bt(k)].eqNullSafe(tomb[f"__changelake_tk{i}"])
            on = cond if on is None else on & cond
        joined = reduced.join(tomb, on, "left").drop(*[f"__changelake_tk{i}" for i in range(len(primary_key))])
    tomb_seq, seq = F.col(_TOMB_SEQ), F.col(SEQ)
    is_delete = F.col(KIND) == int(RowKind.DELETE)
    newer_or_same = F.coalesce(tomb_seq >= seq, F.lit(False))
    newer = F.coalesce(tomb_seq > seq, F.lit(False))
    older = F.coalesce(tomb_seq < seq, F.lit(False))
    flagged = (joined.withColumn("__changelake_blocked", ~is_delete & newer_or_same)
               .withColumn("__changelake_stale", is_delete & newer)
               .withColumn("__changelake_tomb", (is_delete & ~newer_or_same) | (~is_delete & older)))
    helpers = [_TOMB_SEQ, "__changelake_blocked", "__changelake_stale", "__changelake_tomb"]
    table_changes = (flagged.where(~F.col("__changelake_blocked") & ~F.col("__changelake_stale"))
                     .drop(*helpers))
    stamp = F.lit(now).cast("timestamp").alias(DELETED_AT)
    tombstone_changes = (flagged.where(F.col("__changelake_tomb"))
                         .select(*_key(primary_key), F.col(SEQ), F.col(KIND), stamp))
    return FrameSplit(table_changes=table_changes, tombstone_changes=tombstone_changes, flagged=flagged)


@dataclass(frozen=True)
class SplitCounts:
    resurrections_prevented: int
    stale_deletes: int
    tombstone_changes: int         # rows of tombstone_changes
    table_changes: int             # rows of table_changes
    table_deletes: int             # of which -D


def split_counts(split: FrameSplit) -> SplitCounts:
    """The counts of a split: one aggregation, five numbers to the driver."""
    blocked, stale = F.col("__changelake_blocked"), F.col("__changelake_stale")
    kept = ~blocked & ~stale

    def count(condition: Column) -> Column:
        return F.coalesce(F.sum(condition.cast("long")), F.lit(0))

    row = split.flagged.agg(count(blocked).alias("b"), count(stale).alias("s"),
                            count(F.col("__changelake_tomb")).alias("t"), count(kept).alias("k"),
                            count(kept & (F.col(KIND) == int(RowKind.DELETE))).alias("d")).first()
    return SplitCounts(resurrections_prevented=int(row["b"]), stale_deletes=int(row["s"]),
                       tombstone_changes=int(row["t"]), table_changes=int(row["k"]), table_deletes=int(row["d"]))


def align_to_table(reduced: DataFrame, target_schema: pa.Schema) -> DataFrame:
    """The batch with exactly the table's columns (cast, NULL where absent), plus ``_kind``.
    A NOT NULL table column absent from the batch is refused by the caller (``align_to_table`` of the
    Arrow kernel names the rule); here every table column is nullable, as the sink creates them."""
    present = set(reduced.columns)
    columns: list[Any] = []
    for field in target_schema:
        spark_type = from_arrow_type(field.type, prefer_timestamp_ntz=True)
        source = F.col(_bt(field.name)) if field.name in present else F.lit(None)
        columns.append(source.cast(spark_type).alias(field.name))
    return reduced.select(*columns, F.col(KIND).cast("byte").alias(KIND))


@dataclass(frozen=True)
class FrameChecks:
    """What :func:`validate_frame` needs of a batch, counted in one aggregation (the query counts them with
    the batch's kinds: ``changelake.spark.batch_frames.count_kinds``): the rows per ``_kind`` code (None:
    NULL), and the NULLs per column, for at least the key columns and ``_seq``."""

    kinds: Mapping[int | None, int]
    nulls: Mapping[str, int]


def checked_columns(primary_key: Sequence[str]) -> list[str]:
    """The columns whose NULLs :class:`FrameChecks` counts."""
    return [*primary_key, SEQ]


def validate_frame(changes: DataFrame, *, primary_key: Sequence[str], nullable_key: Sequence[str], table: str,
                   checks: FrameChecks | None = None) -> None:
    """``validate_changes`` of the Arrow kernel: the columns and their types from the schema, the rows from
    ``checks`` when given (counted with the batch's kinds), else in one aggregation (one row to the driver).

    ================================================  =====================================
    the batch                                         refused with
    ================================================  =====================================
    lacks a key column, ``_kind`` or ``_seq``         the columns missing
    ``_seq`` not a string                             its type
    a NULL in a key column (not ``nullable_key``),    the count and the column: route them
    in ``_seq`` or in ``_kind``                       to the dead-letter path
    a ``_kind`` code other than 0-3                   the count and the valid codes
    ================================================  =====================================
    """
    missing = [c for c in (*primary_key, KIND, SEQ) if c not in changes.columns]
    if missing:
        raise SinkCommitError(
            f"batch for table {table} lacks column(s) {missing}; every change must carry the primary key "
            f"{list(primary_key)} and the reserved columns {KIND}, {SEQ} (route such rows to the dead-letter path)")
    seq_type = changes.schema[SEQ].dataType
    if not isinstance(seq_type, StringType):
        raise SinkCommitError(f"batch for table {table}: {SEQ} must be a string column, got {seq_type.simpleString()}")
    not_null = [k for k in primary_key if k not in nullable_key] + [SEQ]
    if checks is None or not set(not_null) <= set(checks.nulls):
        checks = frame_checks(changes, checked_columns(primary_key))
    nulls = {**{c: checks.nulls[c] for c in not_null}, KIND: checks.kinds.get(None, 0)}
    for name, n in nulls.items():
        if n:
            raise SinkCommitError(
                f"batch for table {table} has {n} row(s) with a null {name!r}; "
                "route changes with null primary key or ordering columns to the dead-letter path")
    bad = sum(n for code, n in checks.kinds.items() if code is not None and code not in _KIND_CODES)
    if bad:
        raise SinkCommitError(f"batch for table {table} has {bad} row(s) with an unknown {KIND} "
                              "code; valid codes are 0 (+I), 1 (-U), 2 (+U), 3 (-D)")


_KIND_CODES = frozenset(int(k) for k in RowKind)


def frame_checks(changes: DataFrame, columns: Sequence[str]) -> FrameChecks:
    """:class:`FrameChecks` of one batch (NULLs of ``columns``), in one aggregation."""
    rows = changes.groupBy(KIND).agg(F.count(F.lit(1)).alias("count"),
                                     *[F.sum(F.col(_bt(c)).isNull().cast("long")).alias(f"n{i}")
                                       for i, c in enumerate(columns)]).collect()
    return checks_of(rows, columns)


def checks_of(rows: Sequence[Any], columns: Sequence[str]) -> FrameChecks:
    """:class:`FrameChecks` from one batch's rows of an aggregation by ``_kind``: its rows as ``count``, the
    NULLs of ``columns[i]`` as ``n<i>``."""
    return FrameChecks(kinds={(None if r[KIND] is None else int(r[KIND])): int(r["count"]) for r in rows},
                       nulls={c: sum(int(r[f"n{i}"] or 0) for r in rows) for i, c in enumerate(columns)})


def reduce_batch(changes: DataFrame, *, primary_key: Sequence[str], placeholder: str | None, horizon: str | None,
                 target_schema: pa.Schema, table: str) -> tuple[DataFrame, int]:
    """A validated batch (with :func:`with_position`) reduced as the Arrow kernel's flow reduces it:
    the changes older than the table's truncate position ``horizon`` dropped (and counted, in one
    aggregation, with the truncate's order check), placeholders filled, the latest change per key,
    aligned to the table. Returns the reduced batch (lazy: one row per key) and the count dropped."""
    before_truncate = 0
    if horizon is not None:
        prefix = kafka_partition_prefix(horizon)
        seq = F.col(SEQ)
        row = changes.agg(
            F.sum((seq < F.lit(horizon)).cast("long")).alias("before"),
            F.sum((seq.startswith("k") & ~seq.startswith(prefix or "k")).cast("long")).alias("other")).first()
        if prefix is not None and row["other"]:
            raise SinkCommitError(truncate_order_error(horizon, table))
        before_truncate = int(row["before"] or 0)
    changes = drop_before_truncate(changes, horizon)
    changes = fill_unavailable(changes, primary_key=primary_key, placeholder=placeholder)
    return align_to_table(latest_per_key(changes, primary_key=primary_key), target_schema), before_truncate


def freshness_counts(changes: DataFrame, *, committed_at: float,
                     bounds: Sequence[float]) -> tuple[list[int], float] | None:
    """The batch's freshness (``committed_at``, epoch seconds, minus each change's ``_source_ts``; below 0
    counts as 0; changes without a source time are left out) as histogram bucket counts, counted on the
    executors in one aggregation: (per bucket: values in (bounds[i-1], bounds[i]], then above every bound;
    their sum in seconds). None when the batch has no ``_source_ts`` column."""
    if SOURCE_TS not in changes.columns:
        return None
    kind = changes.schema[SOURCE_TS].dataType
    column = F.col(_bt(SOURCE_TS))
    if isinstance(kind, (TimestampType, TimestampNTZType)):
        millis = F.unix_millis(column.cast("timestamp"))
    elif isinstance(kind, IntegralType):
        millis = column.cast("long")
    else:
        raise SinkCommitError(f"{SOURCE_TS} must be a timestamp or epoch milliseconds, got {kind.simpleString()}")
    seconds = F.when(millis.isNotNull(), F.greatest((F.lit(int(committed_at * 1000)) - millis) / 1000.0, F.lit(0.0)))
    row = changes.agg(*[F.sum(F.when(seconds <= F.lit(float(b)), 1).otherwise(0)).alias(f"le{i}")
                        for i, b in enumerate(bounds)],
                      F.count(seconds).alias("n"), F.sum(seconds).alias("sum")).first()
    at_most = [int(row[f"le{i}"] or 0) for i in range(len(bounds))] + [int(row["n"] or 0)]
    return [n - (at_most[i - 1] if i else 0) for i, n in enumerate(at_most)], float(row["sum"] or 0.0)
