"""Spark binding: a kernel over a streaming changelog DataFrame, with bucketed, checkpointed state.

User values cross between the JVM and the Python workers as Arrow only. Around every stateful
node::

    input rows (typed columns, _kind, _seq)
      -> mapInArrow Pack: per Arrow batch and bucket (spark.buckets.bucket_of of the state key
             columns, B buckets), one envelope row
             (bucket, part = input side, payload = the rows as Arrow IPC)
      -> groupBy(bucket).transformWithStateInPandas: per bucket touched by the micro-batch
             state  = ValueState STATE_KERNEL_SNAPSHOT (kernel snapshot bytes, or absent)
             kernel = the worker's cached kernel of the bucket if the state is the snapshot it
                      stored (KernelCache), else Kernel.restore(config, state) if present, else
                      Kernel(config)
             rows   = the bucket's payloads per side, each stably ordered by _seq
             out    = kernel.process(rows) + kernel.finish()   (a join: left rows, then right rows)
             state  = kernel.snapshot() if kernel.state_rows else cleared
             emit   (DATA, out as Arrow IPC, _seq = the row's position in the bucket's output)
                    (REPORT, typed reports: state size, the kernel's figures, late rows)
      -> mapInArrow Unpack: DATA payloads -> typed rows; REPORT payloads -> the report channel

pandas only ever sees the envelope (an int, a tinyint and bytes), never a user value: a BIGINT
at 2^63-1 with NULLs, a DATE in year 1 or 9999, a timestamp past 2262 all cross unchanged. (pyspark
4.2.0 converts every column handed to transformWithStateInPandas to pandas: nullable integers
become float64, timestamps nanoseconds. It has no Arrow variant of transformWithState.)

The state lives in Spark's state store (RocksDB, checkpointed with the query), never only in
Python memory: a restarted query continues from the checkpoint. Rows of one key always land in
the same bucket, so a kernel sees all of a key's history. The output's ``_seq`` keeps each
bucket's order through a downstream shuffle: a downstream bucket sorts its rows by ``_seq``
(stably), so the rows one upstream bucket emitted keep their relative order.

A join packs each input on its own (each side's payloads carry that side's own columns) and
unions the envelopes; both sides are bucketed by the hash of their join-key values (the key types
are equal: the planner checks), so equal keys meet. An event-time join adds, per Arrow batch and
side, one heartbeat payload per bucket carrying that side's largest event time in the batch, so
every bucket agrees on the watermark (``operators/_event_time``).

With ``mini_batch_size`` set in the config, Spark's micro-batch is the mini-batch trigger: each
bucket's share of a micro-batch is folded as one bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ
from changelake.errors import ConfigError, StateError
from changelake.metrics import Figures
from changelake.operators._event_time import LATE_KINDS, WATERMARK_KIND, split_late
from changelake.operators._rows import Changes
from changelake.spark import reports
from changelake.spark.payloads import from_ipc, to_ipc

#: Name of the ValueState holding one bucket's kernel snapshot. Part of the checkpoint contract:
#: renaming it orphans the state of running queries.
STATE_KERNEL_SNAPSHOT = "kernel-snapshot"
SIDES = ("left", "right")

#: The envelope into a stateful operator: bucket, input side, Arrow IPC payload.
PACKED = "bucket int, part tinyint, payload binary"
#: The envelope out of it: what the payload holds, the payload.
EMITTED = "part tinyint, payload binary"
DATA, REPORT = 0, 1

_STATE_SCHEMA = "snapshot BINARY"


class StepClock:
    """Opt-in phase timer of the bucket steps (``CHANGELAKE_STEP_PROFILE=<directory>``): CPU seconds of
    the Python worker per phase of each step (``time.process_time``: on a shared machine, waiting for a
    core is not counted), appended as one JSON line per step to ``<directory>/steps-<pid>.jsonl`` by the
    Python worker that ran it. Off (one attribute test per phase) unless the variable is set."""

    def __init__(self) -> None:
        self.dir = os.environ.get("CHANGELAKE_STEP_PROFILE") or None
        self.phases: dict[str, float] = {}
        self._last = self._gc = 0.0
        self.hit = False

    def start(self) -> None:
        if self.dir:
            if self._on_gc not in gc.callbacks:
                gc.callbacks.append(self._on_gc)
            self.phases = {}
            self._last = time.process_time()

    def tick(self, phase: str) -> None:
        if self.dir:
            now = time.process_time()
            self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
            self._last = now

    def _on_gc(self, phase: str, info: dict) -> None:
        """Collector passes during a step, as their own figure ``(gc)`` (also inside the phases')."""
        if phase == "start":
            self._gc = time.process_time()
        else:
            self.phases["(gc)"] = self.phases.get("(gc)", 0.0) + time.process_time() - self._gc

    def write(self, **facts) -> None:
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)
            with open(os.path.join(self.dir, f"steps-{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps({**facts, "hit": self.hit, **self.phases}) + "\n")


CLOCK = StepClock()


def _bundle_config(config: Any, rows: int) -> Any:
    """The config for one micro-batch: the bucket's rows form one mini-batch bundle."""
    if getattr(config, "mini_batch_size", None) is None:
        return config
    return dataclasses.replace(config, mini_batch_size=max(rows, 1))


@dataclasses.dataclass
class BucketStep:
    """What one bucket's step produced: the output changelog, the new snapshot (None: clear the
    state), the number of state entries, the kernel's figures, and the kernel itself (in the state
    the snapshot holds; None when no kernel holds exactly that state)."""
    out: pa.Table
    snapshot: bytes | None
    state_rows: int
    figures: dict
    kernel: Any = dataclasses.field(default=None, repr=False)


def run_bucket(kernel_cls: type, config: Any, snapshot: bytes | None, table: pa.Table | Sequence[pa.Table],
               output_schema: pa.Schema, *, now: int = 0, kernel: Any = None) -> BucketStep:
    """One bucket's step: restore, process the micro-batch rows, finish, snapshot.

    ``table`` is the bucket's changelog rows, or for a join the pair (left rows, right rows).
    ``kernel``: a kernel already holding exactly the state ``snapshot`` restores (see
    :class:`KernelCache`), run instead of restoring one.
    Pure: usable and testable without Spark.
    """
    return _run_segments(kernel_cls, config, snapshot, _segments(table), output_schema, now, kernel)


def _segments(table: pa.Table | Sequence[pa.Table]) -> list[tuple[str | None, pa.Table]]:
    """The bucket's input in processing order: (side, rows ordered by ``_seq``); side None: one input."""
    if isinstance(table, pa.Table):
        return [(None, _ordered(table))]
    return [(side, _ordered(t)) for side, t in zip(SIDES, table)]


def _run_segments(kernel_cls: type, config: Any, snapshot: bytes | None, segments: list[tuple[str | None, pa.Table]],
                  output_schema: pa.Schema, now: int, kernel: Any = None) -> BucketStep:
    cfg = _bundle_config(config, sum(t.num_rows for _, t in segments))
    CLOCK.tick("other")
    if kernel is not None:
        size = getattr(cfg, "mini_batch_size", None)
        if size is not None:
            kernel.rebundle(size)
    elif snapshot is not None:
        kernel = kernel_cls.restore(cfg, snapshot)
    else:
        kernel = kernel_cls(cfg)
    CLOCK.tick("restore")
    out = Changes()
    for side, rows in segments:
        rows = _user_and_kind(rows)
        out.extend(kernel.process(rows, now=now) if side is None else kernel.process(rows, side=side, now=now))
    out.extend(kernel.finish(now=now))
    rows = kernel.state_rows           # a join counts its rows: once
    CLOCK.tick("kernel")
    data = kernel.snapshot() if rows else None
    CLOCK.tick("snapshot")
    table = out.to_arrow(output_schema)
    CLOCK.tick("to_arrow")
    return BucketStep(table, data, rows, dict(kernel.take_figures()), kernel)


@dataclasses.dataclass
class Poisoned:
    """An input row the kernel could not process, and why."""
    side: str | None
    row: pa.Table             # one row: user columns, ``_kind``, ``_seq``
    error: BaseException


def run_bucket_isolating(kernel_cls: type, config: Any, snapshot: bytes | None,
                         table: pa.Table | Sequence[pa.Table], output_schema: pa.Schema, *,
                         now: int = 0, kernel: Any = None) -> tuple[BucketStep, list[Poisoned]]:
    """:func:`run_bucket`, and when the kernel raises on the bucket's rows, the rows that make it raise
    are found by halving (each half from the state the half before it left) and set aside, so one bad
    change never stops the pipeline in a loop: the state and output are those of the other rows, in
    their order. A :class:`~changelake.errors.StateError` (a policy's deliberate stop) is not caught.
    ``kernel`` (as :func:`run_bucket`'s) runs the first attempt only: after it raised, its state is
    half-changed, and every later attempt restores from ``snapshot``.
    """
    steps: list[BucketStep] = []
    poisoned: list[Poisoned] = []
    _isolate(kernel_cls, config, snapshot, _segments(table), output_schema, now, steps, poisoned, kernel)
    if not poisoned:
        return steps[0], []
    if not steps:           # every row was bad: the state stays as it was
        return BucketStep(Changes().to_arrow(output_schema), snapshot, _rows_of(kernel_cls, config, snapshot),
                          {}), poisoned
    figures = Figures()
    for step in steps:
        figures.update(step.figures)
    return BucketStep(pa.concat_tables([s.out for s in steps]), steps[-1].snapshot, steps[-1].state_rows,
                      dict(figures), steps[-1].kernel), poisoned


def _isolate(kernel_cls, config, snapshot, segments, output_schema, now, steps, poisoned, kernel=None) -> None:
    """Run ``segments`` from the state the last good step left (else ``snapshot``, or ``kernel``, which
    holds it); when the kernel raises, halve them, down to the single rows that make it raise (a bucket
    with no rows re-raises)."""
    snap = steps[-1].snapshot if steps else snapshot
    try:
        steps.append(_run_segments(kernel_cls, config, snap, segments, output_schema, now, kernel))
        return
    except StateError:
        raise
    except Exception as exc:
        if kernel is not None:       # the rows half-changed it: again from the stored state, as without one
            _isolate(kernel_cls, config, snapshot, segments, output_schema, now, steps, poisoned)
            return
        total = sum(t.num_rows for _, t in segments)
        if total == 0:
            raise
        if total == 1:
            side, row = next((side, t) for side, t in segments if t.num_rows)
            poisoned.append(Poisoned(side, row, exc))
            return
    first, second = _halves(segments, total // 2)
    _isolate(kernel_cls, config, snapshot, first, output_schema, now, steps, poisoned)
    _isolate(kernel_cls, config, snapshot, second, output_schema, now, steps, poisoned)


def _halves(segments, n: int):
    """The segments' rows split after the first ``n`` (order kept)."""
    first, second, left = [], [], n
    for side, t in segments:
        if left >= t.num_rows:
            first.append((side, t))
            left -= t.num_rows
        elif left > 0:
            first.append((side, t.slice(0, left)))
            second.append((side, t.slice(left)))
            left = 0
        else:
            second.append((side, t))
    return [s for s in first if s[1].num_rows], [s for s in second if s[1].num_rows]


def _rows_of(kernel_cls: type, config: Any, snapshot: bytes | None) -> int:
    return kernel_cls.restore(config, snapshot).state_rows if snapshot is not None else 0


def _ordered(table: pa.Table) -> pa.Table:
    """Stably ordered by ``_seq`` when present (ties keep arrival order)."""
    if SEQ in table.column_names and table.num_rows > 1:
        return table.sort_by([(SEQ, "ascending")])
    return table


def _user_and_kind(table: pa.Table) -> pa.Table:
    return table.select([n for n in table.column_names if not n.startswith("_") or n == KIND])


def with_positions(out: pa.Table) -> pa.Table:
    """``out`` plus ``_seq``: each row's zero-padded position, the order downstream buckets restore."""
    return out.append_column(SEQ, positions(out.num_rows))


#: digits of a position in ``_seq``: zero-padded, so that the strings order as the numbers do
POSITION_DIGITS = 12


def positions(n: int) -> pa.Array:
    """``"000000000000"``, ``"000000000001"``, ... (``n`` of them), formatted by Arrow's kernels: a Python
    string per row cost 3-4 % of a join step's time."""
    if n >= 10 ** POSITION_DIGITS:
        raise ValueError(f"{n} positions do not fit in {POSITION_DIGITS} digits")
    return pc.utf8_lpad(pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string()), POSITION_DIGITS, "0")


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What the binding reports under: the node id, and whether it dead-letters its late rows."""
    node: str
    late_dead_letter: bool = False


def late_reports(info: NodeInfo, late: pa.Table) -> list[reports.Late]:
    out = []
    user = [n for n in late.schema.names if n not in (KIND, SEQ)]
    for kind, side in LATE_KINDS.items():
        mine = late.filter(pc.equal(late.column(KIND), kind))
        if mine.num_rows:
            rows = (tuple(json.dumps(r, default=str) for r in mine.select(user).to_pylist())
                    if info.late_dead_letter else ())
            out.append(reports.Late(info.node, side, mine.num_rows, rows))
    return out


def poisoned_reports(info: NodeInfo, bad: Sequence[Poisoned]) -> list[reports.Rejected]:
    out = []
    for p in bad:
        row = p.row.to_pylist()[0]
        seq = row.pop(SEQ, None)
        row.pop(KIND, None)
        out.append(reports.Rejected(info.node, p.side or "left", json.dumps(row, default=str), seq,
                                    f"{type(p.error).__name__}: {p.error}"))
    return out


class KernelCache:
    """Per Python worker: the kernel each (node, bucket) was left in by the last step this worker ran,
    with the snapshot that step stored, so the next step of that bucket skips the restore.

    A kernel is only ever reused when the bucket's stored snapshot is byte for byte the one it left (and
    for the same kernel class and config): the state store is the truth. After a restart, a replayed
    micro-batch, a failed or retried task, or a step of the bucket run by another worker, the stored bytes
    differ from the cached ones (or the worker holds nothing) and the kernel is restored from the state as
    before. An entry is taken out while its step runs and put back only once the new snapshot is stored,
    so a step that raises leaves nothing behind. At most ``limit`` state entries are held per worker
    (least recently used buckets dropped first).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple, tuple[type, Any, bytes, Any, int]] = {}
        self._held = 0

    def take(self, key: tuple, kernel_cls: type, config: Any, snapshot: bytes | None) -> Any:
        """The kernel cached under ``key`` if it holds exactly ``snapshot``'s state; the entry leaves
        the cache either way."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        cls, cfg, data, kernel, rows = entry
        self._held -= rows
        try:
            same = cls is kernel_cls and snapshot is not None and data == snapshot and cfg == config
        except (TypeError, ValueError):  # a config whose fields do not compare
            same = False
        return kernel if same else None

    def keeps(self, rows: int) -> bool:
        """Whether a kernel holding ``rows`` state entries would be kept."""
        return rows <= self.limit

    def put(self, key: tuple, kernel_cls: type, config: Any, snapshot: bytes, kernel: Any, rows: int) -> None:
        if not self.keeps(rows):
            return
        self._entries[key] = (kernel_cls, config, snapshot, kernel, rows)
        self._held += rows
        while self._held > self.limit:             # dicts keep insertion order: the oldest first
            oldest = next(iter(self._entries))
            self._held -= self._entries.pop(oldest)[4]

    def clear(self) -> None:
        self._entries.clear()
        self._held = 0

    def __len__(self) -> int:
        return len(self._entries)


#: State entries (a join: rows) a Python worker keeps in kernels between micro-batches, at most, unless
#: ``CHANGELAKE_KERNEL_CACHE_ROWS`` (in the Python workers' environment) says otherwise. Off by default:
#: on 2 cores, bench (b) at full size (quiet machine, 20:29-20:32 UTC) took 70.0 s with 500,000 against
#: 60.1 s with 0. A task finds its bucket's kernel only when Spark hands it the worker that ran the
#: bucket last (about half the time with two tasks), and the kernels a worker keeps slow the other
#: stages that run in it (the aggregate's stage: 6.4 s against 2.6 s); docs/state-design.md.
KERNEL_CACHE_ROWS = 0
#: What one kept entry costs a worker, rounded up: a join row is ~710 bytes of Python objects plus ~95
#: bytes of the kept snapshot (bench (b)'s orders; docs/state-design.md).
ENTRY_BYTES = 1024


def cache_rows(environ=os.environ) -> int:
    """The worker's bound: ``CHANGELAKE_KERNEL_CACHE_ROWS`` or :data:`KERNEL_CACHE_ROWS`, and with a memory cap on the Python workers
    (``spark.executor.pyspark.memory``, which Spark hands them as ``PYSPARK_EXECUTOR_MEMORY_MB``) no
    more than a third of it at :data:`ENTRY_BYTES` per entry."""
    chosen = environ.get("CHANGELAKE_KERNEL_CACHE_ROWS", "").strip()
    limit = int(chosen) if chosen.isdigit() else KERNEL_CACHE_ROWS
    cap = environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "")
    if cap.isdigit():
        return min(limit, int(cap) * 1024 * 1024 // 3 // ENTRY_BYTES)
    return limit


KERNELS = KernelCache(cache_rows())


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block (back to what it was after it).

    A bucket step allocates a kernel's whole state (a restore: every row, entry and key as a Python
    object) and drops most of the previous one: the collector's young-generation passes then keep
    promoting those objects and it runs a full collection every few steps, each traversing every
    object the worker holds. Measured inside the Spark workers over bench (b)'s join buckets, that was
    39% of the steps' CPU time (docs/state-design.md). Kernel state holds no reference cycles, so reference
    counting frees it; what cycles a step does make are collected once the collector is back on.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def step_bucket(state, kernel_cls: type, config: Any, sides: Sequence[pa.Schema], envelopes, output_schema: pa.Schema,
                info: NodeInfo, bucket: int, *, now: int, event_time: bool,
                cache: KernelCache | None = None) -> tuple[pa.Table, list]:
    """One bucket's step inside a ``transformWithStateInPandas`` processor.

    ``envelopes`` are the bucket's ``(part, payload)`` pairs (part = input side, payload = Arrow IPC);
    ``state`` is its ValueState :data:`STATE_KERNEL_SNAPSHOT`. The kernel restored from the state (or
    taken from ``cache``, this worker's :data:`KERNELS`, when the state is the snapshot that kernel
    left) runs the rows (poisoned rows set aside, :func:`run_bucket_isolating`) with the garbage
    collector paused, the state is updated or cleared, and the bucket's output rows come back (an
    event-time join's late rows split off) with its reports: late rows, state size, the kernel's
    figures, poisoned rows.
    """
    parts: list[list[pa.Table]] = [[] for _ in sides]
    for part, payload in envelopes:
        parts[part].append(from_ipc(payload))
    tables = [pa.concat_tables(p).cast(schema) if p else schema.empty_table() for p, schema in zip(parts, sides)]
    CLOCK.tick("inputs")
    stored = state.get()          # None when absent (one round trip to the JVM, not two)
    snapshot = bytes(stored[0]) if stored is not None else None
    CLOCK.tick("state_get")
    cache = KERNELS if cache is None else cache
    key = (info.node, bucket)
    cached = cache.take(key, kernel_cls, config, snapshot)
    CLOCK.hit = cached is not None
    with collector_paused():
        step, bad = run_bucket_isolating(kernel_cls, config, snapshot, tables[0] if len(tables) == 1 else tables,
                                         output_schema, now=now, kernel=cached)
        if not cache.keeps(step.state_rows):
            # freed now, by reference counting: once the collector is back, its first pass would
            # otherwise traverse every object of the bucket's state (6.5% of bench (b)'s join steps)
            step.kernel = cached = None
    if step.snapshot is None:
        state.clear()
    else:
        state.update((step.snapshot,))
        if step.kernel is not None:
            cache.put(key, kernel_cls, config, step.snapshot, step.kernel, step.state_rows)
    CLOCK.tick("state_update")
    out, sent = step.out, []
    if event_time:
        out, late = split_late(out)
        sent.extend(late_reports(info, late))
    sent.append(reports.StateSize(info.node, bucket, step.state_rows,
                                  0 if step.snapshot is None else len(step.snapshot)))
    if step.figures:
        sent.append(reports.Counts(step.figures))
    sent.extend(poisoned_reports(info, bad))
    return out, sent


def _processor_class():
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class BucketedKernelProcessor(StatefulProcessor):
        """One kernel per bucket; its snapshot is the bucket's only state value. ``sides`` holds the
        Arrow schema of each input (one for a single-input kernel, two for a join)."""

        def __init__(self, kernel_cls: type, config: Any, sides: Sequence[pa.Schema], output_schema: pa.Schema,
                     clock: Callable[[Any], int], info: NodeInfo, event_time: bool) -> None:
            self.kernel_cls, self.config, self.clock = kernel_cls, config, clock
            self.sides, self.output_schema, self.info, self.event_time = list(sides), output_schema, info, event_time

        def init(self, handle) -> None:
            self.state = handle.getValueState(STATE_KERNEL_SNAPSHOT, _STATE_SCHEMA)

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            import pandas as pd

            envelopes = ((part, payload) for frame in rows
                         for part, payload in zip(frame.iloc[:, 1].tolist(), frame.iloc[:, 2].tolist()))
            out, sent = step_bucket(self.state, self.kernel_cls, self.config, self.sides, envelopes,
                                    self.output_schema, self.info, int(key[0] if isinstance(key, tuple) else key),
                                    now=self.clock(timerValues), event_time=self.event_time)
            emitted = [(REPORT, reports.encode(sent))]
            if out.num_rows:
                emitted.insert(0, (DATA, to_ipc(with_positions(out))))
            yield pd.DataFrame({"part": pd.Series([p for p, _ in emitted], dtype="int8"),
                                "payload": pd.Series([b for _, b in emitted], dtype=object)})

        def close(self) -> None:
            pass

    return BucketedKernelProcessor


def _processing_time(timer_values) -> int:
    # Wall clock, not timerValues: timeMode "ProcessingTime" makes Spark schedule a no-data batch
    # after every batch, so an availableNow query never ends (pyspark 4.2.0).
    return int(time.time() * 1000)


class _Pack:
    """mapInArrow over one input (user columns, ``_kind``, ``_seq``): per Arrow batch and bucket present
    (:func:`changelake.spark.buckets.bucket_of` of ``keys``), one envelope row with the bucket's rows as
    IPC. With ``time_column``, also one heartbeat payload per bucket with the batch's largest event time."""

    def __init__(self, part: int, schema: pa.Schema, keys: Sequence[str], buckets: int,
                 time_column: str | None = None) -> None:
        self.part, self.schema, self.keys, self.buckets, self.time_column = part, schema, list(keys), buckets, time_column

    def __call__(self, batches):
        from changelake.spark.buckets import split_by_bucket

        for batch in batches:
            if not batch.num_rows:
                continue
            rows = pa.Table.from_batches([batch]).cast(self.schema)
            ids, payloads = [], []
            for bucket, part in split_by_bucket(rows, self.keys, self.buckets):
                ids.append(bucket)
                payloads.append(to_ipc(part))
            if self.time_column is not None:
                top = pc.max(rows.column(self.time_column))
                if top.is_valid:
                    beat = to_ipc(self._heartbeat(top))
                    ids.extend(range(self.buckets))
                    payloads.extend([beat] * self.buckets)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids, pa.int32()), pa.array([self.part] * len(ids), pa.int8()),
                 pa.array(payloads, pa.binary())], names=["bucket", "part", "payload"])

    def _heartbeat(self, top: pa.Scalar) -> pa.Table:
        cols = {f.name: pa.nulls(1, f.type) for f in self.schema}
        cols[self.time_column] = pa.array([top.as_py()], self.schema.field(self.time_column).type)
        cols[KIND] = pa.array([WATERMARK_KIND], pa.int8())
        cols[SEQ] = pa.array([""], pa.string())
        return pa.table(cols, schema=self.schema)


class _Unpack:
    """mapInArrow behind the operator: DATA payloads -> typed rows; REPORT payloads -> the channel."""

    def __init__(self, schema: pa.Schema, channel: reports.ReportChannel | None) -> None:
        self.schema, self.channel = schema, channel

    def __call__(self, batches):
        sent = []
        for batch in batches:
            for part, payload in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                if part == DATA:
                    yield from from_ipc(payload).cast(self.schema).to_batches()
                elif self.channel is not None:
                    sent.extend(reports.decode(payload))
        if self.channel is not None:
            self.channel.send(sent)


def _spark_out(output_schema):
    from pyspark.sql.types import ByteType, StringType, StructField, StructType

    return StructType([f for f in output_schema.fields if f.name not in (KIND, SEQ)]
                      + [StructField(KIND, ByteType(), False), StructField(SEQ, StringType(), False)])


def _packed(df, keys: Sequence[str], part: int, buckets: int, time_column: str | None = None):
    schema = arrow_schema_of(df.schema)
    return df.mapInArrow(_Pack(part, schema, keys if buckets > 1 else (), buckets, time_column), PACKED), schema


def _run(packed, processor, output_schema, channel):
    spark_out = _spark_out(output_schema)
    emitted = (packed.groupBy("bucket")
               .transformWithStateInPandas(statefulProcessor=processor, outputStructType=EMITTED,
                                           outputMode="Append", timeMode="None"))
    return emitted.mapInArrow(_Unpack(arrow_schema_of(spark_out), channel), spark_out)


def apply_kernel(df, kernel_cls: type, config: Any, *, key_columns: Sequence[str], output_schema,
                 buckets: int = 32, channel: reports.ReportChannel | None = None, node: str = "kernel"):
    """Run ``kernel_cls(config)`` over the streaming changelog ``df`` (user columns, ``_kind``, ``_seq``).

    ``key_columns`` are the kernel's state key (a GroupAggregate's group keys, a Deduplicate's
    keys; empty: one bucket, e.g. a global aggregate); ``output_schema`` is the Spark
    ``StructType`` of the kernel's output user columns. Returns the output changelog as a
    streaming DataFrame (Append mode): those columns, ``_kind`` and ``_seq`` (the row's position
    in its bucket's output of the micro-batch). Needs the RocksDB state store provider
    (``spark.sql.streaming.stateStore.providerClass``). ``channel`` receives the node's reports
    under ``node``.
    """
    _check_columns(df, (*key_columns, KIND))
    if not isinstance(buckets, int) or buckets < 1:
        raise ConfigError(f"buckets must be an integer >= 1, got {buckets!r}")
    packed, schema = _packed(df, key_columns, 0, buckets)
    processor = _processor_class()(kernel_cls, config, [schema], arrow_schema_of(output_schema),
                                   _processing_time, NodeInfo(node), False)
    return _run(packed, processor, output_schema, channel)


def apply_join_kernel(left, right, kernel_cls: type, config: Any, *, left_keys: Sequence[str],
                      right_keys: Sequence[str], output_schema, buckets: int = 32,
                      channel: reports.ReportChannel | None = None, node: str = "join",
                      time_columns: tuple[str, str] | None = None, late_dead_letter: bool = False):
    """Run a two-input kernel (the joins) over two streaming changelogs, in one bucketed state.

    Each input is packed on its own, bucketed by the hash of its join-key values, so rows of equal
    keys from both sides meet in the same kernel. Per bucket the kernel processes the left rows,
    then the right rows (each ordered by ``_seq``), then finishes. With ``time_columns`` (an
    interval or temporal join), every bucket hears each batch's largest event time per side, and
    late rows leave as reports (counted; as JSON rows when ``late_dead_letter``). The output is as
    :func:`apply_kernel`'s.
    """
    if len(left_keys) != len(right_keys):
        raise ConfigError(f"the join keys pair up one to one; got left {list(left_keys)}, right {list(right_keys)}")
    if not isinstance(buckets, int) or buckets < 1:
        raise ConfigError(f"buckets must be an integer >= 1, got {buckets!r}")
    _check_columns(left, (*left_keys, KIND, SEQ))
    _check_columns(right, (*right_keys, KIND, SEQ))
    lt, rt = time_columns if time_columns is not None else (None, None)
    lpacked, lschema = _packed(left, left_keys, 0, buckets, lt)
    rpacked, rschema = _packed(right, right_keys, 1, buckets, rt)
    processor = _processor_class()(kernel_cls, config, [lschema, rschema], arrow_schema_of(output_schema),
                                   _processing_time, NodeInfo(node, late_dead_letter), time_columns is not None)
    return _run(lpacked.unionByName(rpacked), processor, output_schema, channel)


def arrow_schema_of(schema) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``; timestamps in UTC, the session time zone
    (``changelake.spark.session.build_session`` sets it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _check_columns(df, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"input has no column(s) {missing}; columns are {df.columns}")
