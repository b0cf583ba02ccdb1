"""Spark binding: a kernel over a streaming changelog DataFrame, with bucketed, checkpointed state.

The keys of the input are hashed into ``buckets`` buckets (``pmod(hash(key columns), B)``), and
``groupBy(bucket).transformWithStateInPandas`` runs one kernel instance per bucket and micro-batch::

    per micro-batch, per bucket touched by it
    -----------------------------------------------------------------------------------
    state  = ValueState STATE_KERNEL_SNAPSHOT of the bucket (kernel snapshot bytes, or absent)
    kernel = Kernel.restore(config, state) if present else Kernel(config)
    rows   = the bucket's rows of the micro-batch, stably ordered by _seq when present
    out    = kernel.process(rows) + kernel.finish()      # mini-batch: the bucket's rows are one bundle
             (a join: process(left rows, side="left") + process(right rows, side="right") + finish())
    state  = kernel.snapshot() if kernel.state_rows else cleared
    emit   out (user columns + _kind + _seq = the row's zero-padded position in the bucket's output)

The state lives in Spark's state store (RocksDB, checkpointed with the query), never only in
Python memory: a restarted query continues from the checkpoint. Rows of one key always land in
the same bucket, so a kernel sees all of a key's history; its output is the output of one kernel
over the whole input, per key and in order (rows of different keys may interleave differently).
The output's ``_seq`` keeps that order through a downstream shuffle: a downstream bucket sorts its
rows by ``_seq`` (stably), so the rows one upstream bucket emitted keep their relative order.

A join (:func:`apply_join_kernel`) unions both inputs into one DataFrame: a side tag, the left
columns, the right columns (nulls on the other side's rows), ``_kind``, ``_seq``; both sides are
bucketed by the hash of their join-key values (the key types are equal), so equal keys meet.

With ``mini_batch_size`` set in the config, Spark's micro-batch is the mini-batch trigger: each
bucket's share of a micro-batch is folded as one bundle (the configured size only switches the
mini-batch mode on), which lets GroupAggregate and Deduplicate take their vectorised Arrow path.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ
from changelake.errors import ConfigError

#: Name of the ValueState holding one bucket's kernel snapshot. Part of the checkpoint contract:
#: renaming it orphans the state of running queries.
STATE_KERNEL_SNAPSHOT = "kernel-snapshot"
#: Column holding the bucket number during the grouping (dropped before the kernel).
BUCKET = "_bucket"

#: Column tagging a join input row's side (0 left, 1 right) in the union of both inputs.
SIDE = "_side"
SIDES = ("left", "right")

_STATE_SCHEMA = "snapshot BINARY"


def _bundle_config(config: Any, rows: int) -> Any:
    """The config for one micro-batch: the bucket's rows form one mini-batch bundle."""
    if getattr(config, "mini_batch_size", None) is None:
        return config
    return dataclasses.replace(config, mini_batch_size=max(rows, 1))


def run_bucket(kernel_cls: type, config: Any, snapshot: bytes | None, table: pa.Table | Sequence[pa.Table],
               output_schema: pa.Schema, *, now: int = 0) -> tuple[pa.Table, bytes | None, int]:
    """One bucket's step: restore, process the micro-batch rows, finish, snapshot.

    ``table`` is the bucket's changelog rows, or for a join the pair (left rows, right rows).
    Returns the output changelog (``output_schema`` + ``_kind``) and the new snapshot
    (None when the kernel holds no state, so the caller clears the bucket's state), and the number
    of entries the kernel holds. Pure: usable and testable without Spark.
    """
    inputs = [table] if isinstance(table, pa.Table) else list(table)
    inputs = [_kernel_input(t) for t in inputs]
    cfg = _bundle_config(config, sum(t.num_rows for t in inputs))
    kernel = kernel_cls.restore(cfg, snapshot) if snapshot is not None else kernel_cls(cfg)
    if len(inputs) == 1:
        out = kernel.process(inputs[0], now=now)
    else:
        out = kernel.process(inputs[0], side=SIDES[0], now=now)
        out.extend(kernel.process(inputs[1], side=SIDES[1], now=now))
    out.extend(kernel.finish(now=now))
    data = kernel.snapshot() if kernel.state_rows else None
    return out.to_arrow(output_schema), data, kernel.state_rows


def _kernel_input(table: pa.Table) -> pa.Table:
    """User columns + ``_kind``, stably ordered by ``_seq`` when present (ties keep arrival order)."""
    if SEQ in table.column_names and table.num_rows > 1:
        table = table.sort_by([(SEQ, "ascending")])
    return table.select([n for n in table.column_names if not n.startswith("_") or n == KIND])


def with_positions(out: pa.Table) -> pa.Table:
    """``out`` plus ``_seq``: each row's zero-padded position, the order downstream buckets restore."""
    return out.append_column(SEQ, pa.array([f"{i:012d}" for i in range(out.num_rows)], pa.string()))


#: ``_kind`` of a row that carries a bucket's state size instead of a change (never leaves the binding).
STATS_KIND = 4


def _stats_row(schema: pa.Schema, key: Any, rows: int, size: int) -> pa.Table:
    bucket = key[0] if isinstance(key, tuple) else key
    table = pa.table({f.name: pa.nulls(1, f.type) for f in schema})
    table = table.append_column(KIND, pa.array([STATS_KIND], pa.int8()))
    return table.append_column(SEQ, pa.array([f"{int(bucket)} {rows} {size}"]))


class StateStats:
    """State size per bucket of one operator, carried from the Python workers to the driver.

    The kernels' gauges (``changelake_state_rows``) are set in the worker processes that run
    them, not in the driver's registry. Each touched bucket emits one extra row (``_kind`` =
    :data:`STATS_KIND`, its bucket, state rows and snapshot bytes in ``_seq``), which a
    ``mapInArrow`` right behind the operator strips and adds to a Spark accumulator. (An
    accumulator updated inside the transformWithStateInPandas worker itself corrupted the
    operator's output on pyspark 4.2.0: rows went missing.) A bucket's state only changes when it
    is touched, so the latest report per bucket is its current size and the sum over buckets is
    the operator's. Buckets not touched since the driver started are unknown (after a restart the
    figures grow back as buckets are touched). Reports are latest-per-bucket, so a retried task
    does not count twice.
    """

    def __init__(self, accumulator: Any, operator: str) -> None:
        self.accumulator, self.operator = accumulator, operator

    @classmethod
    def accumulator(cls, spark: Any) -> Any:
        """A Spark accumulator that every operator's :class:`StateStats` reports into."""
        from pyspark.accumulators import AccumulatorParam

        class LatestPerBucket(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, a: dict, b: dict) -> dict:
                a.update(b)
                return a

        return spark.sparkContext.accumulator({}, LatestPerBucket())

    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """mapInArrow behind the operator: report the stats rows, pass the changes on."""
        for batch in batches:
            is_stats = pc.equal(batch.column(KIND), STATS_KIND)
            reports = {}
            for text in batch.filter(is_stats).column(SEQ).to_pylist():
                bucket, rows, size = (int(x) for x in text.split())
                reports[(self.operator, bucket)] = (rows, size)
            if reports:
                self.accumulator.add(reports)
            yield batch.filter(pc.invert(is_stats))

    @staticmethod
    def totals(value: dict) -> dict[str, tuple[int, int]]:
        """An accumulator's value -> operator -> (state rows, state bytes) over its buckets."""
        out: dict[str, tuple[int, int]] = {}
        for (operator, _), (rows, size) in value.items():
            r, b = out.get(operator, (0, 0))
            out[operator] = (r + rows, b + size)
        return out


def _processor_class():
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class BucketedKernelProcessor(StatefulProcessor):
        """One kernel per bucket; its snapshot is the bucket's only state value.

        ``sides`` is None for a single-input kernel; for a join, per side the positions of its
        columns in the input frame and the side's schema (user columns + ``_kind`` + ``_seq``).
        """

        def __init__(self, kernel_cls: type, config: Any, input_schema: pa.Schema, output_schema: pa.Schema,
                     clock: Callable[[Any], int], sides: Sequence[tuple[list[int], pa.Schema]] | None = None,
                     stats: bool = False) -> None:
            self.kernel_cls, self.config, self.clock = kernel_cls, config, clock
            self.input_schema, self.output_schema, self.sides = input_schema, output_schema, sides
            self.stats = stats          # emit one stats row per bucket (StateStats)

        def init(self, handle) -> None:
            self.state = handle.getValueState(STATE_KERNEL_SNAPSHOT, _STATE_SCHEMA)

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            import pandas as pd

            frames = list(rows)
            frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            # pyspark 4.2 hands columns whose name starts with "_" over as "_<position>": take them by
            # position, with the declared input types (an integer column with nulls arrives as floats).
            frame.columns = self.input_schema.names
            table = pa.Table.from_pandas(frame, schema=self.input_schema, preserve_index=False)
            stored = self.state.get() if self.state.exists() else None
            snapshot = bytes(stored[0]) if stored is not None else None
            out, data, rows = run_bucket(self.kernel_cls, self.config, snapshot, self._split(table),
                                         self.output_schema, now=self.clock(timerValues))
            if data is None:
                self.state.clear()
            else:
                self.state.update((data,))
            if out.num_rows:
                yield _to_pandas(with_positions(out))
            if self.stats:
                yield _to_pandas(_stats_row(self.output_schema, key, rows, 0 if data is None else len(data)))

        def _split(self, table: pa.Table) -> pa.Table | list[pa.Table]:
            if self.sides is None:
                return table
            side = table[SIDE]
            return [pa.Table.from_arrays([table.filter(pc.equal(side, i)).column(p) for p in positions],
                                         schema=schema)
                    for i, (positions, schema) in enumerate(self.sides)]

        def close(self) -> None:
            pass

    return BucketedKernelProcessor


def _to_pandas(table: pa.Table):
    # Strings as Python objects (pandas 3 Arrow-backed strings break transformWithStateInPandas).
    # An integer output column with nulls becomes float64 here; that Spark casts it back to the
    # declared type is not yet covered by a test.
    return table.to_pandas()


def _processing_time(timer_values) -> int:
    # Wall clock, not timerValues: timeMode "ProcessingTime" makes Spark schedule a no-data batch
    # after every batch, so an availableNow query never ends (pyspark 4.2.0).
    return int(time.time() * 1000)


def apply_kernel(df, kernel_cls: type, config: Any, *, key_columns: Sequence[str], output_schema,
                 buckets: int = 32, stats: StateStats | None = None):
    """Run ``kernel_cls(config)`` over the streaming changelog ``df`` (user columns, ``_kind``, ``_seq``).

    ``key_columns`` are the kernel's state key (a GroupAggregate's group keys, a Deduplicate's
    keys; empty: one bucket, e.g. a global aggregate); ``output_schema`` is the Spark
    ``StructType`` of the kernel's output user columns. Returns the output changelog as a
    streaming DataFrame (Append mode): those columns, ``_kind`` and ``_seq`` (the row's position
    in its bucket's output of the micro-batch). Needs the RocksDB state store provider
    (``spark.sql.streaming.stateStore.providerClass``). ``stats`` receives every touched bucket's
    state size (:class:`StateStats`).
    """

    _check_columns(df, (*key_columns, KIND))
    bucketed = df.withColumn(BUCKET, _bucket(key_columns, buckets))
    processor = _processor_class()(kernel_cls, config, arrow_schema_of(bucketed.schema),
                                   arrow_schema_of(output_schema), _processing_time, stats=stats is not None)
    return _transform(bucketed, processor, output_schema, stats)


class LateRows:
    """Late rows of the event-time joins, carried from the Python workers to the driver.

    The kernel emits a late input row in its output (``_kind`` 5 left, 7 right, in that side's
    columns); a ``mapInArrow`` right behind the operator takes them out of the changelog and adds
    them to a Spark accumulator: per (node, side) the count and, when the node dead-letters late
    rows, the rows as JSON. The driver reads and resets it after each micro-batch (:meth:`take`).
    """

    def __init__(self, accumulator: Any, node: str, dead_letter: bool) -> None:
        self.accumulator, self.node, self.dead_letter = accumulator, node, dead_letter

    @classmethod
    def accumulator(cls, spark: Any) -> Any:
        from pyspark.accumulators import AccumulatorParam

        class Collect(AccumulatorParam):
            def zero(self, value: dict) -> dict:
                return {}

            def addInPlace(self, a: dict, b: dict) -> dict:
                for k, (n, rows) in b.items():
                    m, old = a.get(k, (0, []))
                    a[k] = (m + n, old + rows)
                return a

        return spark.sparkContext.accumulator({}, Collect())

    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json

        from changelake.operators._event_time import LATE_KINDS

        kinds = pa.array(list(LATE_KINDS), pa.int8())
        for batch in batches:
            is_late = pc.is_in(batch.column(KIND), kinds)
            late = batch.filter(is_late)
            if late.num_rows:
                report = {}
                user = [n for n in late.schema.names if n not in (KIND, SEQ)]
                for kind, side in LATE_KINDS.items():
                    mine = late.filter(pc.equal(late.column(KIND), kind))
                    if mine.num_rows:
                        rows = ([json.dumps(r, default=str) for r in mine.select(user).to_pylist()]
                                if self.dead_letter else [])
                        report[(self.node, side)] = (mine.num_rows, rows)
                self.accumulator.add(report)
            yield batch.filter(pc.invert(is_late))

    @staticmethod
    def take(accumulator: Any) -> dict:
        """The accumulated ``{(node, side): (count, json rows)}``, and reset it (driver only)."""
        value = dict(accumulator.value)
        accumulator.value = {}
        return value


class _WithHeartbeats:
    """mapInArrow over the bucketed union of a join's inputs, right before the grouping: passes every
    row on and adds, per Arrow batch and input present in it, one heartbeat row per bucket carrying
    that input's largest event time in the batch (``_kind`` WATERMARK_KIND), so every bucket's kernel
    sees the event times of every bucket's rows (see ``operators/_event_time``). In the same pass as
    the rows, so nothing upstream is computed twice."""

    def __init__(self, time_columns: tuple[str, str], buckets: int, schema: pa.Schema) -> None:
        self.time_columns, self.buckets, self.schema = time_columns, buckets, schema

    def __call__(self, batches):
        for batch in batches:
            yield batch
            if not batch.num_rows:
                continue
            side = batch.column(SIDE)
            for tag, column in enumerate(self.time_columns):
                top = pc.max(pc.filter(batch.column(column), pc.equal(side, tag)))
                if top.is_valid:
                    yield self._beats(tag, column, top)

    def _beats(self, tag: int, column: str, top: pa.Scalar) -> pa.RecordBatch:
        from changelake.operators._event_time import WATERMARK_KIND

        n = self.buckets
        fill = {column: pa.array([top.as_py()] * n), SIDE: pa.array([tag] * n), KIND: pa.array([WATERMARK_KIND] * n),
                SEQ: pa.array([""] * n), BUCKET: pa.array(range(n))}
        return pa.RecordBatch.from_arrays(
            [fill[f.name].cast(f.type) if f.name in fill else pa.nulls(n, f.type) for f in self.schema],
            schema=self.schema)


def apply_join_kernel(left, right, kernel_cls: type, config: Any, *, left_keys: Sequence[str],
                      right_keys: Sequence[str], output_schema, buckets: int = 32, stats: StateStats | None = None,
                      time_columns: tuple[str, str] | None = None, late: LateRows | None = None):
    """Run a two-input kernel (the joins) over two streaming changelogs, in one bucketed state.

    Both inputs (user columns, ``_kind``, ``_seq``) are unioned into one DataFrame with a
    ``_side`` tag and per-side columns, bucketed by the hash of their join-key values, so rows
    of equal keys from both sides meet in the same kernel. Per bucket the kernel processes the
    left rows, then the right rows (each ordered by ``_seq``), then finishes. The output is as
    :func:`apply_kernel`'s.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType

    if len(left_keys) != len(right_keys):
        raise ConfigError(f"the join keys pair up one to one; got left {list(left_keys)}, right {list(right_keys)}")
    _check_columns(left, (*left_keys, KIND, SEQ))
    _check_columns(right, (*right_keys, KIND, SEQ))
    lcols = [c for c in left.columns if c not in (KIND, SEQ)]
    rcols = [c for c in right.columns if c not in (KIND, SEQ)]
    lnames = [f"_l{i}" for i in range(len(lcols))]
    rnames = [f"_r{i}" for i in range(len(rcols))]
    ltypes = {f.name: f.dataType for f in left.schema.fields}
    rtypes = {f.name: f.dataType for f in right.schema.fields}
    # the join key of either side, under one name per key part (the types are equal: the planner checks)
    knames = [f"_k{i}" for i in range(len(left_keys))]

    def side(df, tag: int):
        def cols(mine: bool, src: list[str], names: list[str], types: dict):
            return [F.col(c).alias(n) if mine else F.lit(None).cast(types[c]).alias(n) for c, n in zip(src, names)]

        keys = left_keys if tag == 0 else right_keys
        return df.select(F.lit(tag).cast(ByteType()).alias(SIDE), *cols(tag == 0, lcols, lnames, ltypes),
                         *cols(tag == 1, rcols, rnames, rtypes),
                         *[F.col(k).alias(n) for k, n in zip(keys, knames)], F.col(KIND), F.col(SEQ))

    lside, rside = side(left, 0), side(right, 1)
    union = lside.unionByName(rside)
    bucketed = union.withColumn(BUCKET, _bucket(knames, buckets)).drop(*knames)
    if time_columns is not None:
        # every bucket hears of every input row's event time (operators/_event_time)
        columns = (lnames[lcols.index(time_columns[0])], rnames[rcols.index(time_columns[1])])
        bucketed = bucketed.mapInArrow(_WithHeartbeats(columns, buckets, arrow_schema_of(bucketed.schema)),
                                       bucketed.schema)
    input_schema = arrow_schema_of(bucketed.schema)
    names = input_schema.names
    kind_seq = [names.index(KIND), names.index(SEQ)]
    sides = []
    for own, src, df in ((lnames, lcols, left), (rnames, rcols, right)):
        schema = arrow_schema_of(df.select(*src, KIND, SEQ).schema)
        sides.append(([names.index(n) for n in own] + kind_seq, schema))
    processor = _processor_class()(kernel_cls, config, input_schema, arrow_schema_of(output_schema),
                                   _processing_time, sides, stats is not None)
    return _transform(bucketed, processor, output_schema, stats, late)


def arrow_schema_of(schema) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``; timestamps in UTC, the session time zone
    (``changelake.spark.session.build_session`` sets it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _check_columns(df, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"input has no column(s) {missing}; columns are {df.columns}")


def _bucket(key_columns: Sequence[str], buckets: int):
    """``pmod(hash(keys), buckets)``; one bucket (0) when the state has no key."""
    from pyspark.sql import functions as F

    if not isinstance(buckets, int) or buckets < 1:
        raise ConfigError(f"buckets must be an integer >= 1, got {buckets!r}")
    if not key_columns:
        return F.lit(0)
    return F.pmod(F.hash(*[F.col(c) for c in key_columns]), F.lit(buckets))


def _transform(bucketed, processor, output_schema, stats: StateStats | None = None, late: LateRows | None = None):
    from pyspark.sql.types import ByteType, StringType, StructField, StructType

    spark_out = StructType([f for f in output_schema.fields if f.name not in (KIND, SEQ)]
                           + [StructField(KIND, ByteType(), False), StructField(SEQ, StringType(), False)])
    out = (bucketed.groupBy(BUCKET)
           .transformWithStateInPandas(statefulProcessor=processor, outputStructType=spark_out,
                                       outputMode="Append", timeMode="None"))
    if late is not None:
        out = out.mapInArrow(late.strip, spark_out)
    return out if stats is None else out.mapInArrow(stats.strip, spark_out)
