"""The pipeline's Spark query: Kafka source -> decode stage -> (operator graph) -> ``foreachBatch``.

The query (:meth:`PipelineQuery.stream`)::

    Kafka read tasks (executors), one Python process each: read, decode (DecodeStage) and, with an
    operator graph, route (changelake.spark.chain.RoutedStage):
        the graph sources' rows -> the chain's first envelopes (by the state bucket of their consumer)
        everything else (stats, dead letters, rows of mirrored sources, ...) -> envelopes addressed
        to the driver
    -> one shuffle -> the chain's operators (changelake.spark.chain) -> Deliver: each graph table's
       changes and the driver's payloads, as the decode stage's payloads
    foreachBatch: ONE Spark action per micro-batch (``toArrow``), so the stateful operators run once
    per batch; the collected payloads go to the service's ``BatchProcessor.process_decoded`` (pure
    Arrow, no Spark), the workers' reports to /metrics; once it returned (the Delta commits are
    done), the batch's end offsets go to the pipeline's consumer group (informational: Spark's
    checkpoint stays the position). The query has one branch, so Kafka is read and decoded once
    per batch without an exchange of its own; without a graph it is the read tasks' payloads.
    With framed tables (the processor's ``framed_tables``: ``storage.reduce_on``), the batch is
    persisted instead, everything but those tables' rows is collected, and each of them reaches
    ``process_decoded`` as a DataFrame (``frames``) for its sink's ``apply_frame``
    (:mod:`changelake.spark.batch_frames`).

A rebuilt checkpoint's first batch also reads the mirrored sources' table snapshots (the processor's
``snapshots``, route -> ``TableSnapshot``; ``changelake.service.rebuild``) into the chain.

The processor is duck-typed (``stage``, ``plan``, ``executor_plan`` (optional), ``routes``, ``graph_routes``, ``buckets``,
``graph_tables``, ``framed_tables``, ``process_decoded``): this wing imports nothing from the service above it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from changelake import metrics
from changelake.changelog import KIND, SEQ
from changelake.spark.batch_frames import CheckRows, FramedBatch, TableFrame, count_kinds, spark_schema
from changelake.spark.chain import Chain, RoutedStage, SourceEnvelopes, run_chain, source_nodes
from changelake.spark.checkpoint import batch_end_offsets, use_local_file_manager
from changelake.spark.compile import DEFAULT_BUCKETS
from changelake.spark.decode_stage import SPARK_SCHEMA as DECODE_STAGE_SCHEMA
from changelake.spark.decode_stage import decoding_source
from changelake.spark.groups import GroupLayout, checkpoint_layout
from changelake.spark.kafka_source import SOURCE_NAME, KafkaOptions, commit_group_offsets
from changelake.spark.reports import ReportChannel

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class PipelineQuery:
    """The Spark side of one pipeline: builds the streaming DataFrame and is its ``foreachBatch``."""

    def __init__(self, processor: Any, *, read_tasks: int) -> None:
        self.processor = processor
        self.read_tasks = read_tasks
        #: called with the batch id after each batch's Delta commits (set by :func:`start`)
        self.after_batch: Callable[[int], None] | None = None
        #: the operators' reports to the driver (set by :meth:`stream`), drained after each batch
        self.channel: ReportChannel | None = None
        #: framed tables that are collected all the same (a column type Spark has none for), warned once
        self._unfit: set[str] = set()
        self._chain: Chain | None = None        # the compiled graph (set by :meth:`source_stage`)
        #: the chain's group numbering (set by :func:`start` from the checkpoint; None: the old one)
        self.groups: GroupLayout | None = None

    def source_stage(self) -> Any:
        """What the Kafka read tasks run over the records they read: the pipeline's decode stage; with an
        operator graph, that stage followed by the routing of the graph sources' rows into the chain's
        first envelopes (:class:`~changelake.spark.chain.RoutedStage`), everything else addressed to the driver."""
        p = self.processor
        plan = _executor_plan(p)
        if plan is None:
            return p.stage
        if self._chain is None:
            self._chain = Chain.of(plan, p.buckets, DEFAULT_BUCKETS, two_phase=True, groups=self.groups)
        nodes = source_nodes(plan)
        envelopes = SourceEnvelopes(self._chain, {i: nodes[node.source] for i, node in p.graph_routes.items()},
                                    mirrored=[i for i in p.graph_routes if p.routes[i].spec.table is not None])
        return RoutedStage(p.stage, envelopes, getattr(p, "snapshots", None))

    def stream(self, decoded: Any) -> Any:
        """The streaming DataFrame ``foreachBatch`` receives, from the decoding source registered with
        :meth:`source_stage`: without a graph, the decode stage's payloads (``DECODE_STAGE_SCHEMA``);
        with one, the chain's envelopes, run through its operators (one shuffle before the first: no
        other exchange, so Kafka is read and decoded once per batch) and delivered as the same payloads
        plus each graph table's changes."""
        p = self.processor
        plan = _executor_plan(p)
        if plan is None:
            return decoded
        if self._chain is None:
            self.source_stage()
        self.channel = ReportChannel(decoded.sparkSession)
        p.graph_tables = [plan[s].table for s in self._chain.sinks]
        return run_chain(self._chain, decoded, self.channel)

    # Spark calls this with the batch DataFrame and its id.
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if getattr(self.processor, "clock", None) is not None:
            self.processor.clock.mark("plan")       # restart to first commit (changelake.service.restart_clock)
        framed = self._framed()
        if framed is None:
            out = batch_df.toArrow()                              # the batch's only Spark action
            log.info("batch %d: %d bytes collected on the driver", batch_id, out.nbytes)
            self._process(out, batch_id, {})
        else:
            self._process_framed(batch_df, batch_id, framed)
        if self.after_batch is not None:
            self.after_batch(batch_id)
        release_arrow_memory()

    def _process(self, out: pa.Table, batch_id: int, frames: dict[str, TableFrame]) -> None:
        # the workers' reports: state sizes, figures and lookup statistics go to /metrics here; the late
        # rows go with the batch (dead letters). A replayed batch reports again, as it recomputes.
        drained = self.channel.drain() if self.channel is not None else None
        extra = {"frames": frames} if frames else {}
        self.processor.process_decoded(out, batch_id, late_rows=drained.late if drained else {},
                                       rejected=drained.rejected if drained else (), **extra)

    def _framed(self) -> FramedBatch | None:
        """Where this batch's framed tables are (None: none, the whole batch is collected)."""
        p = self.processor
        tables = p.framed_tables() if hasattr(p, "framed_tables") else {}
        if not tables:
            return None
        mirrors, graph = {}, {}
        for i, route in enumerate(p.routes):
            name = route.spec.table
            if name in tables:
                mirrors[i] = (name, tables[name], route.decoder.output_schema)
        if _executor_plan(p) is not None:
            sinks = {n.table: n for n in p.plan.sinks}
            for j, name in enumerate(p.graph_tables):
                if name in tables:
                    schema = sinks[name].schema.append(pa.field(KIND, pa.int8())).append(pa.field(SEQ, pa.string()))
                    graph[j] = (name, tables[name], schema)
        unfit = set()
        for name, _, schema in (*mirrors.values(), *graph.values()):
            try:
                spark_schema(schema)
            except TypeError as exc:        # a column type Spark cannot hold: the table is collected
                if name not in self._unfit:
                    log.warning("table %s: its changes are collected on the driver (storage.reduce_on applies "
                                "to tables whose columns Spark can hold): %s", name, exc)
                unfit.add(name)
        self._unfit |= unfit
        mirrors = {i: m for i, m in mirrors.items() if m[0] not in unfit}
        graph = {j: g for j, g in graph.items() if g[0] not in unfit}
        return FramedBatch(mirrors=mirrors, graph=graph) if mirrors or graph else None

    def _process_framed(self, batch_df: Any, batch_id: int, framed: FramedBatch) -> None:
        """The batch with its framed tables' changes left on the executors (:mod:`changelake.spark.batch_frames`):
        the rest is collected as before, each framed table goes to the processor as a DataFrame."""
        from pyspark.sql import functions as F

        checks = {i: (key, name) for i, (name, key, _) in framed.mirrors.items()}
        checked = batch_df.mapInArrow(CheckRows(checks), DECODE_STAGE_SCHEMA) if checks else batch_df
        checked.persist()
        persisted = [checked]
        try:
            is_framed = framed.framed_payload()
            out = checked.select("_route", "part", is_framed.alias("framed"),
                                 F.when(is_framed, F.lit(bytearray())).otherwise(F.col("payload")).alias("payload")).toArrow()
            present = {(r, part) for r, part, f in zip(out["_route"].to_pylist(), out["part"].to_pylist(),
                                                      out["framed"].to_pylist()) if f}
            out = out.filter(pc.invert(out["framed"])).drop_columns(["framed"])
            tables = framed.tables(checked, present, batch_id, getattr(self.processor, "generation", 0))
            for changes in tables.values():
                changes.persist()
                persisted.append(changes)
            counted = count_kinds(tables, framed.keys())
            frames = {name: TableFrame(changes=changes, kinds=counted[name][0], checks=counted[name][1])
                      for name, changes in tables.items()}
            log.info("batch %d: %d bytes collected on the driver; table(s) %s stay on the executors",
                     batch_id, out.nbytes, sorted(frames))
            self._process(out, batch_id, frames)
        finally:
            for frame in reversed(persisted):
                frame.unpersist()


class _GroupOffsets:
    """After a batch: commit its end offsets (from the checkpoint's offset log) to a consumer group."""

    def __init__(self, checkpoint: str, reader_options: Mapping[str, str], group_id: str) -> None:
        self.checkpoint = checkpoint
        self.options = KafkaOptions.parse(reader_options)
        self.group_id = group_id

    def __call__(self, batch_id: int) -> None:
        try:
            end = batch_end_offsets(self.checkpoint, batch_id)
        except Exception:  # informational offsets never fail a batch
            log.warning("batch %d: cannot read its offsets from the checkpoint; consumer group %s not updated",
                        batch_id, self.group_id, exc_info=True)
            return
        if end:
            commit_group_offsets(self.options, self.group_id, end)


def _executor_plan(processor: Any) -> Any:
    """The operator graph the query runs on the executors (None: none, or it runs on the driver behind the
    transaction gate: the processor's ``executor_plan``)."""
    return getattr(processor, "executor_plan", processor.plan)


def start(spark: Any, query: PipelineQuery, *, name: str, checkpoint: str, reader_options: Mapping[str, str],
          available_now: bool, trigger_seconds: float, group_id: str | None = None,
          spark_kafka_options: Mapping[str, str] | None = None) -> Any:
    """Start the streaming query; returns Spark's StreamingQuery. With ``group_id``, each batch's end
    offsets are committed to that consumer group after the batch's Delta commits. ``reader_options`` are the
    ``python`` reader's (:class:`~changelake.spark.kafka_source.KafkaOptions`); with ``spark_kafka_options``
    Spark's own Kafka source reads instead, with those options (:mod:`changelake.spark.spark_kafka`)."""
    if group_id is not None:
        query.after_batch = _GroupOffsets(checkpoint, reader_options, group_id)
    if _executor_plan(query.processor) is not None:        # the operators' state (changelake.spark.binding)
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        # which group (so which shuffle partition) holds each state bucket: as the checkpoint recorded it
        query.groups = checkpoint_layout(checkpoint, int(spark.conf.get("spark.sql.shuffle.partitions")))
    use_local_file_manager(spark, checkpoint)       # set before the query takes its Hadoop configuration
    if spark_kafka_options is not None:       # Spark's Kafka source, the decode stage in a mapInArrow behind it
        from changelake.spark.spark_kafka import load

        decoded = load(spark, spark_kafka_options, reader_options, query.source_stage())
    else:
        # the source decodes in its read tasks: registered per query, as it carries this pipeline's decode stage
        spark.dataSource.register(decoding_source(query.source_stage()))
        reader = spark.readStream.format(SOURCE_NAME)
        for k, v in reader_options.items():
            reader = reader.option(k, v)
        decoded = reader.load()
    writer = (query.stream(decoded).writeStream.queryName(name)
              .foreachBatch(query)
              .option("checkpointLocation", checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def release_arrow_memory() -> None:
    """After a micro-batch: Arrow's memory pool gives the pages its freed buffers left back to the system.

    The driver collects each batch as Arrow buffers of a different size; Arrow's pool (mimalloc in the
    pyarrow wheels, glibc's allocator where the session chose it: changelake/spark/session.py ``ARROW_POOL``)
    kept the freed pages, and the driver's resident memory grew with every batch under a steady stream
    (bench/soak.py, docs/benchmarks.md). The gauge shows what live buffers remain."""
    pool = pa.default_memory_pool()
    pool.release_unused()
    metrics.ARROW_MEMORY.set(pool.bytes_allocated())
