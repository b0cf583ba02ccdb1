"""Spark binding: a kernel over a streaming changelog DataFrame, with bucketed, checkpointed state.

The keys of the input are hashed into ``buckets`` buckets (``pmod(hash(key columns), B)``), and
``groupBy(bucket).transformWithStateInPandas`` runs one kernel instance per bucket and micro-batch::

    per micro-batch, per bucket touched by it
    -----------------------------------------------------------------------------------
    state  = ValueState STATE_KERNEL_SNAPSHOT of the bucket (kernel snapshot bytes, or absent)
    kernel = Kernel.restore(config, state) if present else Kernel(config)
    rows   = the bucket's rows of the micro-batch, stably ordered by _seq when present
    out    = kernel.process(rows) + kernel.finish()      # mini-batch: the bucket's rows are one bundle
    state  = kernel.snapshot() if kernel.state_rows else cleared
    emit   out (user columns + _kind)

The state lives in Spark's state store (RocksDB, checkpointed with the query), never only in
Python memory: a restarted query continues from the checkpoint. Rows of one key always land in
the same bucket, so a kernel sees all of a key's history; its output is the output of one kernel
over the whole input, per key and in order (rows of different keys may interleave differently).

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

from changelake.changelog import KIND, SEQ
from changelake.errors import ConfigError

#: Name of the ValueState holding one bucket's kernel snapshot. Part of the checkpoint contract:
#: renaming it orphans the state of running queries.
STATE_KERNEL_SNAPSHOT = "kernel-snapshot"
#: Column holding the bucket number during the grouping (dropped before the kernel).
BUCKET = "_bucket"

_STATE_SCHEMA = "snapshot BINARY"


def _bundle_config(config: Any, rows: int) -> Any:
    """The config for one micro-batch: the bucket's rows form one mini-batch bundle."""
    if getattr(config, "mini_batch_size", None) is None:
        return config
    return dataclasses.replace(config, mini_batch_size=max(rows, 1))


def run_bucket(kernel_cls: type, config: Any, snapshot: bytes | None, table: pa.Table,
               output_schema: pa.Schema, *, now: int = 0) -> tuple[pa.Table, bytes | None]:
    """One bucket's step: restore, process the micro-batch rows, finish, snapshot.

    Returns the output changelog (``output_schema`` + ``_kind``) and the new snapshot
    (None when the kernel holds no state, so the caller clears the bucket's state).
    Pure: usable and testable without Spark.
    """
    if SEQ in table.column_names and table.num_rows > 1:
        table = table.sort_by([(SEQ, "ascending")])  # sort_by is stable: ties keep arrival order
    table = table.select([n for n in table.column_names if not n.startswith("_") or n == KIND])
    cfg = _bundle_config(config, table.num_rows)
    kernel = kernel_cls.restore(cfg, snapshot) if snapshot is not None else kernel_cls(cfg)
    out = kernel.process(table, now=now)
    out.extend(kernel.finish(now=now))
    data = kernel.snapshot() if kernel.state_rows else None
    return out.to_arrow(output_schema), data


def _processor_class():
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class BucketedKernelProcessor(StatefulProcessor):
        """One kernel per bucket; its snapshot is the bucket's only state value."""

        def __init__(self, kernel_cls: type, config: Any, input_schema: pa.Schema, output_schema: pa.Schema,
                     clock: Callable[[Any], int]) -> None:
            self.kernel_cls, self.config, self.clock = kernel_cls, config, clock
            self.input_schema, self.output_schema = input_schema, output_schema

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
            out, data = run_bucket(self.kernel_cls, self.config, snapshot, table, self.output_schema,
                                   now=self.clock(timerValues))
            if data is None:
                self.state.clear()
            else:
                self.state.update((data,))
            if out.num_rows:
                yield _to_pandas(out)

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
                 buckets: int = 32):
    """Run ``kernel_cls(config)`` over the streaming changelog ``df`` (user columns, ``_kind``, ``_seq``).

    ``key_columns`` are the kernel's state key (a GroupAggregate's group keys, a Deduplicate's
    keys); ``output_schema`` is the Spark ``StructType`` of the kernel's output user columns
    (``_kind`` is appended). Returns the output changelog as a streaming DataFrame (Append mode).
    Needs the RocksDB state store provider
    (``spark.sql.streaming.stateStore.providerClass``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import ByteType, StructField, StructType

    if not isinstance(buckets, int) or buckets < 1:
        raise ConfigError(f"buckets must be an integer >= 1, got {buckets!r}")
    if not key_columns:
        raise ConfigError("key_columns must name the kernel's state key columns")
    missing = [c for c in (*key_columns, KIND) if c not in df.columns]
    if missing:
        raise ConfigError(f"input has no column(s) {missing}; columns are {df.columns}")
    arrow_schema = to_arrow_schema(output_schema)
    spark_out = StructType(list(output_schema.fields) + [StructField(KIND, ByteType(), False)])
    bucketed = df.withColumn(BUCKET, F.pmod(F.hash(*[F.col(c) for c in key_columns]), F.lit(buckets)))
    input_schema = to_arrow_schema(bucketed.schema)
    processor = _processor_class()(kernel_cls, config, input_schema, arrow_schema, _processing_time)
    return (bucketed.groupBy(BUCKET)
            .transformWithStateInPandas(statefulProcessor=processor, outputStructType=spark_out,
                                        outputMode="Append", timeMode="None"))
