"""Run a physical plan on Spark Structured Streaming: one streaming DataFrame per sink table.

:func:`compile_plan` takes one typed, decoded streaming DataFrame per source (the source's
columns, ``_kind``, ``_seq``) and returns, per sink table, its changelog as a streaming
DataFrame (the sink input's columns, ``_kind``, ``_seq``). Every node of the plan becomes::

    source       select the node's columns, cast to its schema (key changes arrive split: see
                 ``physical``, the service's decode stage does it)
    filter       rows where the SQL predicate is true (F.expr, the text the planner checked)
    project      F.expr per output column, cast to the planned type
    stateful     drop -U first when drop_update_before; then the kernel in bucketed state, its rows
                 crossing as Arrow IPC envelopes: groupBy(pmod(hash(state keys), B))
                 .transformWithStateInPandas (changelake.spark.binding)
    aggregate    two-phase when its calls merge (:func:`is_two_phase`): a stateless mapInArrow
                 folds each Arrow batch per group key into partial accumulators, one row per
                 (task, batch, key); then the global kernel merges them in bucketed state
    join         each input packed on its own (part = its side), bucketed by the join-key values,
                 the two envelopes unioned
    interval / temporal join
                 as join, plus per input task batch one heartbeat row per bucket with its largest
                 event time (every bucket then agrees on the watermark); the kernel's late rows
                 leave as reports on the report channel (changelake.spark.reports)
    lookup_join  repartition(B, stream lookup key columns), then a stateless mapInArrow: each Python
                 worker keeps one LookupJoiner (and its cache) per node, so within a micro-batch a
                 key's rows meet one cache and one lookup; _kind and _seq pass through
    sink         its input

Ordering: a stateful node's rows carry ``_seq`` (the source's ordering token, or the row's
position in its upstream bucket's output of the micro-batch), and each bucket sorts its rows
by it stably, so the rows of one key reach the kernel in the order their upstream emitted
them, whatever the shuffle did. Rows of different upstream buckets have no order between
them (as rows of different keys in :class:`~changelake.plan.local.LocalRunner` may
interleave differently); the final state of every table is the same.

The state of each stateful node lives in the RocksDB state store of its
``transformWithStateInPandas`` operator, checkpointed with the query. Spark identifies that
state by the operator's position in the query: changing the plan's shape (adding, removing
or reordering stateful nodes) needs a new checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from changelake.changelog import KIND, SEQ, RowKind
from changelake.errors import ConfigError
from changelake.operators.group_aggregate import (
    EncodedGlobalGroupAggregate,
    GroupAggregate,
    encode_partial,
    local_partials,
    mergeable,
)
from changelake.plan.physical import EVENT_TIME_OPS, TWO_INPUT_OPS, PhysicalNode, PhysicalPlan
from changelake.spark.binding import apply_join_kernel, apply_kernel
from changelake.spark.reports import ReportChannel, lookup_report

#: Buckets per stateful node unless the caller says otherwise (docs/state-design.md: B=32 for keys
#: of many values; a low-cardinality key touches at most as many buckets as it has values).
DEFAULT_BUCKETS = 32


def spark_schema(node: PhysicalNode):
    """The Spark StructType of ``node``'s user columns (all nullable: outer joins pad with nulls)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True) for f in from_arrow_schema(node.schema).fields])


def kernel_class(node: PhysicalNode) -> type:
    """The class whose ``restore`` continues a snapshot of ``node``'s kernel (rank: a factory's product)."""
    return node.kernel if isinstance(node.kernel, type) else type(node.make_kernel())


def is_two_phase(node: PhysicalNode) -> bool:
    """True if the executor runs aggregate ``node`` two-phase (local pre-aggregation, then global):
    a mini-batch GroupAggregate whose calls all merge (no DISTINCT; see ``group_aggregate.mergeable``)."""
    return (node.op == "aggregate" and node.kernel is GroupAggregate
            and node.config.mini_batch_size is not None and mergeable(node.config))


def compile_plan(plan: PhysicalPlan, sources: Mapping[str, Any], *,
                 buckets: int | Mapping[str, int] = DEFAULT_BUCKETS, channel: ReportChannel | None = None,
                 two_phase: bool = True) -> dict[str, Any]:
    """``{table: changelog DataFrame}`` for every sink of ``plan``.

    ``sources`` maps each source name to its decoded streaming DataFrame (at least the
    source's columns, ``_kind`` and ``_seq``). ``buckets`` is one bucket count for every stateful
    node, or per node id (missing ids get :data:`DEFAULT_BUCKETS`; a lookup join repartitions into
    its node's count). ``channel`` (:class:`~changelake.spark.reports.ReportChannel`) receives every
    node's reports under its node id: state sizes, stale retractions, materializer corrections,
    the event-time joins' late rows, the lookup joins' figures (without it they are dropped).
    ``two_phase=False`` runs every aggregate one-phase (the global kernel's snapshots are the
    one-phase GroupAggregate's, so either continues the other's state; the stateless local step
    adds no state of its own).
    """
    missing = sorted({n.source for n in plan.sources} - set(sources))
    if missing:
        raise ConfigError(f"no streaming DataFrame for source(s) {missing}")
    frames: dict[str, Any] = {}
    for node in plan:
        ins = [frames[i] for i in node.inputs]
        b = buckets if isinstance(buckets, int) else buckets.get(node.id, DEFAULT_BUCKETS)
        if node.op == "lookup_join":
            frames[node.id] = lookup_join(node, ins[0], b, channel)
            continue
        frames[node.id] = _compile_node(node, ins, sources, b, channel, two_phase)
    return {n.table: frames[n.id] for n in plan.sinks}


def _compile_node(node: PhysicalNode, ins: list, sources: Mapping[str, Any], buckets: int,
                  channel: ReportChannel | None, two_phase: bool = True):
    from pyspark.sql import functions as F

    if node.op == "source":
        types = spark_schema(node)
        return sources[node.source].select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in types.fields],
                                           F.col(KIND).cast("tinyint").alias(KIND), F.col(SEQ))
    if node.op == "filter":
        return ins[0].filter(F.coalesce(F.expr(node.predicate), F.lit(False)))
    if node.op == "project":
        types = {f.name: f.dataType for f in spark_schema(node).fields}
        return ins[0].select(*[F.expr(expr).cast(types[name]).alias(name) for name, expr in node.projections],
                             F.col(KIND), F.col(SEQ))
    if node.op == "sink":
        return ins[0]
    if not node.stateful:
        raise ConfigError(f"node {node.id!r}: the Spark executor has no rule for op {node.op!r}")
    if node.drop_update_before:
        ins = [df.filter(F.col(KIND) != int(RowKind.UPDATE_BEFORE)) for df in ins]
    cls = kernel_class(node)
    if node.op in TWO_INPUT_OPS:
        lkeys, rkeys = node.state_keys
        return apply_join_kernel(ins[0], ins[1], cls, node.config, left_keys=lkeys, right_keys=rkeys,
                                 output_schema=spark_schema(node), buckets=buckets, channel=channel, node=node.id,
                                 time_columns=(node.time_columns or None) if node.op in EVENT_TIME_OPS else None,
                                 late_dead_letter=getattr(node, "late_rows", None) == "dead_letter")
    (keys,) = node.state_keys
    if two_phase and is_two_phase(node):
        local, keys = local_aggregate(ins[0], node.config)
        return apply_kernel(local, EncodedGlobalGroupAggregate, node.config, key_columns=keys,
                            output_schema=spark_schema(node), buckets=buckets if keys else 1, channel=channel,
                            node=node.id)
    return apply_kernel(ins[0], cls, node.config, key_columns=keys, output_schema=spark_schema(node),
                        buckets=buckets if keys else 1, channel=channel, node=node.id)


#: Per Python worker: the lookup joiner of each lookup join node (by node id and config), whose cache
#: outlives the task, so later micro-batches routed to this worker find their keys cached.
_JOINERS: dict[tuple[str, Any], Any] = {}


class _LookupJoin:
    """mapInArrow: a task's rows (one hash partition of the lookup key) joined by this worker's joiner."""

    def __init__(self, node_id: str, config: Any, schema, channel: ReportChannel | None) -> None:
        self.node_id, self.config, self.schema, self.channel = node_id, config, schema, channel

    def __call__(self, batches):
        import pyarrow as pa

        from changelake.operators.lookup_join import LookupJoiner

        key = (self.node_id, self.config)
        joiner = _JOINERS.get(key)
        if joiner is None:
            joiner = _JOINERS[key] = LookupJoiner(self.config)
        for batch in batches:
            if batch.num_rows:
                out = joiner.join(pa.Table.from_batches([batch]))
                yield from out.select(self.schema.names).cast(self.schema).to_batches()
        if self.channel is not None:
            self.channel.send([lookup_report(self.config.lookup.name, joiner.take_stats())])


def lookup_join(node: PhysicalNode, df, partitions: int, channel: ReportChannel | None = None):
    """A lookup join node over changelog ``df``: repartitioned by the stream's lookup key columns into
    ``partitions`` tasks, each joined in a Python worker's cached :class:`LookupJoiner`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType, StringType, StructField, StructType

    from changelake.spark.binding import arrow_schema_of

    (keys,) = node.state_keys
    out = StructType(spark_schema(node).fields + [StructField(KIND, ByteType(), False),
                                                  StructField(SEQ, StringType(), True)])
    parts = df.select(*[F.col(c) for c in df.columns if not c.startswith("_")], F.col(KIND), F.col(SEQ)) \
        .repartition(partitions, *[F.col(k) for k in keys])
    return parts.mapInArrow(_LookupJoin(node.id, node.config, arrow_schema_of(out), channel), out)


#: Name of the partial-accumulator column between the local and the global aggregate (not "_"-prefixed:
#: the binding hands only user columns and ``_kind`` to the kernel); suffixed if a group key has it.
PARTIAL = "partial"


class _LocalAggregate:
    """mapInArrow: a task's Arrow batch folded per group key (``LocalGroupAggregate`` semantics).

    Emits per key of the batch one row: the key columns, :data:`PARTIAL` (the pickled
    ``[record_count, [acc per call]]``), ``_kind`` +I and ``_seq`` of the key's first row in the
    batch (so the global bucket orders partials as their first rows arrived upstream).
    """

    def __init__(self, config: Any, keys: list[str], partial: str, schema) -> None:
        self.config, self.keys, self.partial, self.schema = config, keys, partial, schema

    def __call__(self, batches):
        import pyarrow as pa

        for batch in batches:
            if not batch.num_rows:
                continue
            table = pa.Table.from_batches([batch])
            partials, first = local_partials(table, self.config)
            at = pa.array(first, pa.int64())
            yield pa.RecordBatch.from_arrays(
                [*(table.column(k).take(at).combine_chunks() for k in self.keys),
                 pa.array([encode_partial(p) for p in partials], pa.binary()),
                 pa.array([int(RowKind.INSERT)] * len(first), pa.int8()),
                 table.column(SEQ).take(at).combine_chunks()], schema=self.schema)


def local_aggregate(df, config: Any) -> tuple[Any, list[str]]:
    """The local step of a two-phase aggregate over changelog ``df``: the partials DataFrame (group key
    columns, :data:`PARTIAL`, ``_kind``, ``_seq``) and the names of its key columns."""
    from pyspark.sql.types import BinaryType, ByteType, StringType, StructField, StructType

    from changelake.spark.binding import arrow_schema_of

    user = [f for f in df.schema.fields if not f.name.startswith("_")]
    keys = [user[i] for i in config.group_keys]
    partial = PARTIAL
    while partial in {k.name for k in keys}:
        partial += "_"
    out = StructType([StructField(k.name, k.dataType, True) for k in keys]
                     + [StructField(partial, BinaryType(), False), StructField(KIND, ByteType(), False),
                        StructField(SEQ, StringType(), True)])
    names = [k.name for k in keys]
    return df.mapInArrow(_LocalAggregate(config, names, partial, arrow_schema_of(out)), out), names


#: Spark schema of packed changes (the same columns as the decode stage's payloads).
PACKED_SCHEMA = "_route smallint, part string, payload binary"
#: ``part`` of a payload holding sink-table changes; ``_route`` is the table's index.
CHANGES_PART = "changes"


class _Pack:
    """mapInArrow: a task's rows of one table as Arrow IPC payloads (one per input batch)."""

    def __init__(self, route: int) -> None:
        self.route = route

    def __call__(self, batches):
        import pyarrow as pa

        from changelake.spark.decode_stage import SCHEMA
        from changelake.spark.payloads import to_ipc

        for batch in batches:
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [pa.array([self.route], pa.int16()), pa.array([CHANGES_PART]),
                     pa.array([to_ipc(pa.Table.from_batches([batch]))], pa.binary())], schema=SCHEMA)


def packed_changes(tables: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """All tables' changelogs as one DataFrame of IPC payloads (``PACKED_SCHEMA``), and the table
    name of each ``_route`` index: one Spark action collects every table of a micro-batch."""
    names = list(tables)
    frames = [tables[name].mapInArrow(_Pack(i), PACKED_SCHEMA) for i, name in enumerate(names)]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out, names
