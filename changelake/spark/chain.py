"""A physical plan on Spark as one linear chain of stateful operators: each stateful node runs once,
the stateful nodes of one level of the graph in one operator.

A DataFrame read by two consumers is planned twice by Spark, stateful operators and all, so a graph
with fan-out cannot map one DataFrame to each node (docs/state-design.md). Here every stateful
node's output has exactly one reader: the operator after it in the chain. The query is::

    the Kafka read tasks (RoutedStage): decoded rows -> envelopes (SourceEnvelopes; compile_packed's
    typed sources: a mapInArrow SourceRouter per source, unioned), driver payloads -> DRIVER envelopes
      -> groupBy(g).transformWithStateInPandas(ChainProcessor 0)    the stateful nodes of level 1
      -> repartition(B, g).mapInArrow(LookupStage 1)               a lookup join of level 2
      -> groupBy(g).transformWithStateInPandas(ChainProcessor 2)    the stateful nodes of level 2
      ...                                                          (:attr:`Chain.stages`)
      -> mapInArrow Deliver: sink envelopes -> packed table changes; driver envelopes -> the decode
         stage's payloads; report envelopes -> the channel

An **envelope** is one row ``(g, target, bucket, part, payload)``: ``payload`` holds rows as Arrow
IPC, addressed to ``target`` (a chain node's index in :attr:`Chain.order`, a sink table, :data:`REPORTS`,
or :data:`DRIVER`: a decode stage payload for the driver, passed through to the end), to state bucket ``bucket`` of that node and, for a join, to its input ``part``.
``g`` is the group key of the next operator: the group number of the bucket (offset by its node's range
among the operator's buckets) for envelopes addressed to a node it runs, a negative pass-through group
for every other envelope. The numbers come from the chain's
:class:`~changelake.spark.groups.GroupLayout`, which spreads a node's buckets and the pass-through
envelopes evenly over the shuffle partitions.

Operator ``k`` groups by ``g``. A group ``g >= 0`` holds one bucket of one of its nodes: the processor
restores the bucket's kernel from its state (one ``ValueState`` per bucket, as the binding), runs it
over the bucket's rows ordered by ``_seq``, stores the snapshot, and hands the output to the
**router**. A negative group is passed through unchanged (only ``g`` is recomputed for the next
operator), without state: a handful of Python calls per operator and batch, whatever the traffic.

A lookup join (stateless, but a key's rows of a micro-batch should meet one lookup and one cache)
has a place in the chain too, without state: ``repartition(B, g)`` then a ``mapInArrow``
(:class:`LookupStage`) joining the task's envelopes addressed to it in one call of the worker's
cached ``LookupJoiner`` and routing the result; the rest passes through.

The router (:class:`Router`) runs behind each kernel, each lookup stage and at the sources. It
applies the stateless steps behind the node as ``LocalRunner`` does (filter and select in DuckDB
through ``changelake.plan.sql``) and addresses the rows to every consumer: each lookup join and
each downstream stateful node, split by that node's state key into its
buckets (:func:`changelake.spark.buckets.bucket_of`), its ``-U`` dropped when the node asks, the
two-phase aggregate's local fold done here, and the event-time joins' heartbeats (one per bucket,
the largest event time of the rows sent) added here; and each sink table. Reports (state sizes,
figures, late rows, rejected rows, lookup figures) travel as envelopes addressed to
:data:`REPORTS` to the end of the chain, where ``Deliver`` hands them to the report channel.

Checkpoint contract: a node's state lives in its stage's ``transformWithStateInPandas`` operator of the
query, in ValueState ``kernel-snapshot`` of its bucket's group ``g``. The stages (per level, or one per
node for checkpoints recorded before levels), the bucket count per node, :func:`bucket_of` and the group
layout (recorded in the checkpoint, :func:`~changelake.spark.groups.checkpoint_layout`) decide where a
key's state is: a plan of another shape, other bucket counts or another bucket function need a new
checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ, RowKind
from changelake.errors import ConfigError
from changelake.operators._event_time import WATERMARK_KIND
from changelake.operators.group_aggregate import (
    EncodedGlobalGroupAggregate,
    GroupAggregate,
    encode_partial,
    local_partials,
    mergeable,
)
from changelake.plan.physical import EVENT_TIME_OPS, PhysicalNode, PhysicalPlan
from changelake.spark import binding, reports
from changelake.spark.binding import (
    STATE_KERNEL_SNAPSHOT,
    NodeInfo,
    step_bucket,
    with_positions,
)
from changelake.spark.buckets import split_by_bucket
from changelake.spark.groups import GroupLayout
from changelake.spark.payloads import from_ipc, to_ipc

#: Spark DDL of an envelope (see the module docstring).
ENVELOPE = "g int, target smallint, bucket int, part tinyint, payload binary"
ENVELOPE_ARROW = pa.schema([pa.field("g", pa.int32(), False), pa.field("target", pa.int16(), False),
                            pa.field("bucket", pa.int32(), False), pa.field("part", pa.int8(), False),
                            pa.field("payload", pa.binary(), False)])
#: ``target`` of report payloads (encoded ``changelake.spark.reports``).
REPORTS = -1
#: ``target`` of the decode stage's payloads for the driver (stats, dead letters, the rows of mirrored
#: sources, ...): ``bucket`` = their ``_route``, ``part`` = their part's index in ``decode_stage.PARTS``.
DRIVER = -2
#: ``part`` of a packed payload holding a sink table's changes (``_route`` is the table's index).
CHANGES_PART = "changes"
#: Name of the partial-accumulator column between the local and the global aggregate (not "_"-prefixed:
#: the kernel sees only user columns and ``_kind``); suffixed while a group key has it.
PARTIAL = "partial"

_STATE_SCHEMA = "snapshot BINARY"


def kernel_class(node: PhysicalNode) -> type:
    """The class whose ``restore`` continues a snapshot of ``node``'s kernel (rank: a factory's product)."""
    return node.kernel if isinstance(node.kernel, type) else type(node.make_kernel())


def is_two_phase(node: PhysicalNode) -> bool:
    """True if the executor runs aggregate ``node`` two-phase (local pre-aggregation, then global):
    a mini-batch GroupAggregate whose calls all merge (no DISTINCT; see ``group_aggregate.mergeable``)."""
    return (node.op == "aggregate" and node.kernel is GroupAggregate
            and node.config.mini_batch_size is not None and mergeable(node.config))


def _changelog(schema: pa.Schema) -> pa.Schema:
    """``schema`` (user columns, all nullable) plus ``_kind`` and ``_seq``."""
    return pa.schema([f.with_nullable(True) for f in schema]
                     + [pa.field(KIND, pa.int8()), pa.field(SEQ, pa.string())])


@dataclasses.dataclass(frozen=True)
class Chain:
    """What every router and operator of one compiled plan knows (pickled into the Python workers).

    ``order`` numbers the chain's nodes (an envelope's ``target``); ``stages`` says which nodes each of
    the query's operators runs, in the query's order. With a per-level layout a stage holds every
    stateful node of one level of the graph (one more than the deepest chain node upstream of it), each
    node's buckets one range of the stage's (``offsets``); a lookup join is a stage of its own. Else
    each node is a stage, in ``order``."""
    plan: PhysicalPlan
    order: tuple[str, ...]                  # stateful and lookup join node ids, topological; ``target`` = index
    sinks: tuple[str, ...]                  # sink node ids; ``target`` len(order) + i, ``_route`` i
    buckets: Mapping[str, int]              # per stateful node (1 when its state has no key)
    two_phase: frozenset[str]               # aggregate nodes run local-global
    renames: Mapping[str, tuple[str, ...]]  # project nodes whose expressions are all column references: the inputs
    groups: GroupLayout = dataclasses.field(default_factory=GroupLayout.legacy)   # bucket -> ``g``
    stages: tuple[tuple[int, ...], ...] = ()  # per operator of the query: the ``order`` indexes it runs
    offsets: tuple[int, ...] = ()           # per ``order`` index: its first bucket among its stage's

    @classmethod
    def of(cls, plan: PhysicalPlan, buckets: int | Mapping[str, int], default: int, two_phase: bool,
           groups: GroupLayout | None = None) -> Chain:
        """The chain of ``plan``; ``groups`` None: the old numbering (``g`` = the bucket)."""
        from changelake.plan import sql

        order = tuple(n.id for n in plan if n.stateful or n.op == "lookup_join")
        per = {}
        for node_id in order:
            b = buckets if isinstance(buckets, int) else buckets.get(node_id, default)
            if not isinstance(b, int) or b < 1:
                raise ConfigError(f"buckets of {node_id!r} must be an integer >= 1, got {b!r}")
            per[node_id] = b if any(plan[node_id].state_keys) else 1
        phased = frozenset(i for i in order if two_phase and is_two_phase(plan[i]))
        renames = {}
        for n in plan:
            if n.op == "project":
                columns = sql.column_references(n.projections, plan[n.inputs[0]].schema)
                if columns is not None:
                    renames[n.id] = columns
        layout = groups if groups is not None else GroupLayout.legacy()
        stages = _levels(plan, order) if layout.per_level else tuple((i,) for i in range(len(order)))
        offsets = [0] * len(order)
        for stage in stages:
            first = 0
            for i in stage:
                offsets[i] = first
                first += per[order[i]]
        widest = max((sum(per[order[i]] for i in stage) for stage in stages), default=0)
        return cls(plan, order, tuple(n.id for n in plan.sinks), per, phased, renames,
                   layout.with_buckets(widest), stages, tuple(offsets))

    @functools.cached_property
    def _stage_of(self) -> np.ndarray:
        out = np.zeros(len(self.order), np.int64)
        for s, stage in enumerate(self.stages):
            out[list(stage)] = s
        return out

    def next_group(self, target: np.ndarray, bucket: np.ndarray, stage: int) -> np.ndarray:
        """``g`` of envelopes (``target``, ``bucket``: node and its bucket) for the query's operator
        ``stage``: the group of the node's bucket in it for envelopes of the nodes it runs, else a
        pass-through group (:meth:`GroupLayout.next_group`)."""
        target = np.asarray(target)
        bucket = np.asarray(bucket, np.int64)
        node = (target >= 0) & (target < len(self.order))
        if self.groups.per_level and node.any():
            at = target[node]
            operator = np.full(len(target), -1, np.int64)
            operator[node] = self._stage_of[at]
            bucket = bucket.copy()
            bucket[node] += np.asarray(self.offsets, np.int64)[at]
            return self.groups.next_group(operator, bucket, stage)
        return self.groups.next_group(np.where(node, target, -1), bucket, stage)

    def stage_bucket(self, stage: int, bucket: int) -> tuple[int, int]:
        """The ``order`` index of the node whose bucket is ``bucket`` of operator ``stage``, and its bucket."""
        for i in reversed(self.stages[stage]):
            if bucket >= self.offsets[i]:
                return i, bucket - self.offsets[i]
        raise KeyError(f"bucket {bucket} of operator {stage}")

    def target(self, node_id: str) -> int:
        """An envelope's ``target`` for node ``node_id`` (a chain node or a sink)."""
        if node_id in self.sinks:
            return len(self.order) + self.sinks.index(node_id)
        return self.order.index(node_id)

    def keys(self, node: PhysicalNode, side: int) -> tuple[str, ...]:
        """The columns of ``node``'s input ``side`` that decide the bucket."""
        if node.id in self.two_phase:
            return self.partial_keys(node)[0]
        return tuple(node.state_keys[side]) if node.state_keys else ()

    def partial_keys(self, node: PhysicalNode) -> tuple[tuple[str, ...], str]:
        """Two-phase aggregate: the group key column names and the partial column's name."""
        user = self.plan[node.inputs[0]].schema
        keys = tuple(user.field(i).name for i in node.config.group_keys)
        partial = PARTIAL
        while partial in keys:
            partial += "_"
        return keys, partial

    def side_schema(self, node: PhysicalNode, side: int) -> pa.Schema:
        """The Arrow schema of the rows of ``node``'s input ``side`` (user columns, ``_kind``, ``_seq``)."""
        inp = self.plan[node.inputs[side]].schema
        if node.id in self.two_phase:
            keys, partial = self.partial_keys(node)
            return _changelog(pa.schema([inp.field(k) for k in keys] + [pa.field(partial, pa.binary())]))
        return _changelog(inp)


def _levels(plan: PhysicalPlan, order: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The chain's stages, one per level: a chain node's level is one more than the deepest chain node
    upstream of it. Per level, its lookup joins (a stage each, stateless), then its stateful nodes."""
    index = {node_id: i for i, node_id in enumerate(order)}
    depth: dict[str, int] = {}
    for n in plan:
        deepest = max((depth[i] for i in n.inputs), default=0)
        depth[n.id] = deepest + 1 if n.id in index else deepest
    stages: list[tuple[int, ...]] = []
    for level in sorted({depth[i] for i in order}):
        nodes = [index[i] for i in order if depth[i] == level]
        stages.extend((i,) for i in nodes if plan[order[i]].op == "lookup_join")
        stateful = tuple(i for i in nodes if plan[order[i]].op != "lookup_join")
        if stateful:
            stages.append(stateful)
    return tuple(stages)


#: Per Python worker: the lookup joiner of each lookup join node (by node id and config), whose cache
#: outlives the task, so later micro-batches find their keys cached.
_JOINERS: dict[tuple[str, Any], Any] = {}


def _joiner(node: PhysicalNode):
    from changelake.operators.lookup_join import LookupJoiner

    key = (node.id, node.config)
    joiner = _JOINERS.get(key)
    if joiner is None:
        joiner = _JOINERS[key] = LookupJoiner(node.config)
    return joiner


class Envelopes:
    """Envelopes being written by a router whose output operator ``stage + 1`` reads next."""

    def __init__(self, chain: Chain, stage: int) -> None:
        self.chain, self.next = chain, stage + 1
        self.target: list[int] = []
        self.bucket: list[int] = []
        self.part: list[int] = []
        self.payload: list[bytes] = []
        self.sent: list = []                      # reports

    def add(self, target: int, bucket: int, part: int, payload: bytes) -> None:
        self.target.append(target)
        self.bucket.append(bucket)
        self.part.append(part)
        self.payload.append(payload)

    def batch(self) -> pa.RecordBatch:
        if self.sent:
            self.add(REPORTS, 0, 0, reports.encode(self.sent))
            self.sent = []
        target = np.array(self.target, dtype=np.int16)
        bucket = np.array(self.bucket, dtype=np.int32)
        out = pa.RecordBatch.from_arrays(
            [pa.array(self.chain.next_group(target, bucket, self.next)), pa.array(target), pa.array(bucket),
             pa.array(np.array(self.part, dtype=np.int8)), pa.array(self.payload, pa.binary())],
            schema=ENVELOPE_ARROW)
        self.target, self.bucket, self.part, self.payload = [], [], [], []
        return out


class Router:
    """Applies the stateless steps behind a node and addresses its rows to every consumer."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def route(self, node_id: str, rows: pa.Table, out: Envelopes) -> None:
        """``rows`` (node ``node_id``'s output: its columns, ``_kind``, ``_seq``) to its consumers."""
        if rows.num_rows == 0:
            return
        from changelake.plan import (
            sql,  # DuckDB: imported by the workers that filter or select
        )

        plan = self.chain.plan
        for c in plan.consumers(node_id):
            if c.op == "filter":
                self.route(c.id, sql.apply_filter(rows, c.predicate), out)
            elif c.op == "project":
                columns = self.chain.renames.get(c.id)
                if columns is not None:            # only column references: no need to ask DuckDB
                    schema = _changelog(c.schema)
                    projected = rows.select([*columns, KIND, SEQ]).rename_columns(schema.names).cast(schema)
                else:
                    projected = sql.apply_project(rows, c.projections, c.schema).append_column(SEQ, rows.column(SEQ))
                self.route(c.id, projected, out)
            elif c.op == "sink":
                schema = _changelog(c.schema)
                out.add(self.chain.target(c.id), 0, 0, to_ipc(rows.select(schema.names).cast(schema)))
            elif c.stateful or c.op == "lookup_join":
                for side, inp in enumerate(c.inputs):
                    if inp == node_id:
                        self._to_kernel(c, side, rows, out)
            else:
                raise ConfigError(f"node {c.id!r}: the Spark executor has no rule for op {c.op!r}")

    def _to_kernel(self, node: PhysicalNode, side: int, rows: pa.Table, out: Envelopes) -> None:
        chain = self.chain
        if node.drop_update_before:
            rows = rows.filter(pc.not_equal(rows.column(KIND), pa.scalar(int(RowKind.UPDATE_BEFORE), pa.int8())))
        if node.id in chain.two_phase:
            rows = self._local_aggregate(node, rows)
        schema = chain.side_schema(node, side)
        rows = rows.select(schema.names).cast(schema)
        target, buckets = chain.target(node.id), chain.buckets[node.id]
        for bucket, part in split_by_bucket(rows, chain.keys(node, side), buckets):
            out.add(target, bucket, side, to_ipc(part))
        if node.op in EVENT_TIME_OPS and rows.num_rows:
            column = node.time_columns[side]
            top = pc.max(rows.column(column))
            if top.is_valid:
                cols = {f.name: pa.nulls(1, f.type) for f in schema}
                cols[column] = pa.array([top.as_py()], schema.field(column).type)
                cols[KIND] = pa.array([WATERMARK_KIND], pa.int8())
                cols[SEQ] = pa.array([""], pa.string())
                beat = to_ipc(pa.table(cols, schema=schema))
                for bucket in range(buckets):
                    out.add(target, bucket, side, beat)

    def _local_aggregate(self, node: PhysicalNode, rows: pa.Table) -> pa.Table:
        """The local step of a two-phase aggregate: one row per group key of ``rows`` (the keys, the pickled
        partial ``[record_count, [acc per call]]``, ``_kind`` +I, ``_seq`` of the key's first row)."""
        if rows.num_rows == 0:
            return rows
        keys, partial = self.chain.partial_keys(node)
        partials, first = local_partials(rows, node.config)
        at = pa.array(first, pa.int64())
        cols = {k: rows.column(k).take(at) for k in keys}
        cols[partial] = pa.array([encode_partial(p) for p in partials], pa.binary())
        cols[KIND] = pa.array([int(RowKind.INSERT)] * len(first), pa.int8())
        cols[SEQ] = rows.column(SEQ).take(at)
        return pa.table(cols)


class LookupStage:
    """mapInArrow of a lookup join's position in the chain (behind ``repartition(B, g)``): the task's
    envelopes addressed to the node are joined in one call of this worker's cached joiner (so a key's
    rows of a micro-batch meet one lookup) and routed on; every other envelope passes through."""

    def __init__(self, chain: Chain, stage: int) -> None:
        (self.position,) = chain.stages[stage]
        self.chain, self.stage = chain, stage
        self.node = chain.plan[chain.order[self.position]]

    def __call__(self, batches):
        mine: list[bytes] = []
        for batch in batches:
            target = batch.column(1).to_numpy()
            own = target == self.position
            if own.any():
                mine.extend(batch.column(4).filter(pa.array(own)).to_pylist())
            if not own.all():
                rest = batch.filter(pa.array(~own))
                g = self.chain.next_group(rest.column(1).to_numpy(), rest.column(2).to_numpy(), self.stage + 1)
                # one schema for every batch this task yields: Spark hands the envelopes in as nullable
                # columns, and the joined envelopes below are built as ENVELOPE_ARROW
                yield pa.RecordBatch.from_arrays([pa.array(g), *rest.columns[1:]], schema=ENVELOPE_ARROW)
        if mine:
            schema = self.chain.side_schema(self.node, 0)
            rows = pa.concat_tables([from_ipc(p) for p in mine]).cast(schema)
            joiner = _joiner(self.node)
            joined = joiner.join(rows)
            out = Envelopes(self.chain, self.stage)
            out.sent.append(reports.lookup_report(self.node.config.lookup.name, joiner.take_stats()))
            result = _changelog(self.node.schema)
            Router(self.chain).route(self.node.id, joined.select(result.names).cast(result), out)
            yield out.batch()


class SourceRouter:
    """mapInArrow over one source's decoded rows: per Arrow batch, the envelopes of every source node
    reading it, addressed as the router addresses a kernel's output."""

    def __init__(self, chain: Chain, nodes: Sequence[str]) -> None:
        self.chain, self.nodes = chain, list(nodes)

    def __call__(self, batches):
        router = Router(self.chain)
        out = Envelopes(self.chain, -1)
        for batch in batches:
            if not batch.num_rows:
                continue
            route_source(router, self.nodes, pa.Table.from_batches([batch]), out)
            if out.target or out.sent:
                yield out.batch()


def route_source(router: Router, nodes: Sequence[str], rows: pa.Table, out: Envelopes) -> None:
    """A source's decoded rows (at least its columns, ``_kind``, ``_seq``) to the consumers of each of
    its source ``nodes``, cast to the node's schema."""
    for node_id in nodes:
        schema = _changelog(router.chain.plan[node_id].schema)
        router.route(node_id, rows.select(schema.names).cast(schema), out)


class SourceEnvelopes:
    """The decode stage's payloads (``_route``, ``part``, ``payload``) -> the chain's first envelopes.

    The ``rows`` of each route feeding the graph (``sources``: route -> its source node ids) are routed
    to their consumers as :class:`SourceRouter` routes typed rows, once per call: all of a task's rows
    of a route are gathered first, so a two-phase aggregate's local fold sends one partial per group key
    and task. Every other payload goes to the driver as an envelope addressed to :data:`DRIVER`, and so
    do the ``rows`` of a route that is also mirrored into a table (``mirrored``); :class:`Deliver` turns
    those back into the stage's payloads. Run in the Kafka read task itself (:class:`RoutedStage`), so
    the typed rows never leave the Python process that decoded them.
    """

    #: decoded graph rows a task holds before routing them (a micro-batch without a record limit)
    HOLD_ROWS = 1_000_000

    def __init__(self, chain: Chain, sources: Mapping[int, Sequence[str]], mirrored: Sequence[int] = ()) -> None:
        self.chain = chain
        self.sources = {int(r): list(nodes) for r, nodes in sources.items()}
        self.mirrored = frozenset(mirrored)

    def route_chunks(self, chunks: Iterable[Sequence[tuple[int, str, bytes | pa.Table]]]) -> Iterator[pa.RecordBatch]:
        """The decode stage's payloads, chunk by chunk (``DecodeStage.chunks``: the graph routes' ``rows`` may be
        Arrow tables, taken as they are) -> envelopes."""
        from changelake.spark.decode_stage import PARTS

        out = Envelopes(self.chain, -1)
        rows: dict[int, list[pa.Table]] = {}
        held = 0
        for payloads in chunks:
            for route, part, payload in payloads:
                if part == "rows" and route in self.sources:
                    table = payload if isinstance(payload, pa.Table) else from_ipc(payload)
                    rows.setdefault(route, []).append(table)
                    held += table.num_rows
                    if route not in self.mirrored:
                        continue
                    if isinstance(payload, pa.Table):
                        payload = to_ipc(payload)
                out.add(DRIVER, route, PARTS.index(part), payload)
            if held >= self.HOLD_ROWS:          # a long backlog: route what is held, bounding the task's memory
                self._route(rows, out)
                rows, held = {}, 0
            if out.target:
                yield out.batch()
        self._route(rows, out)
        if out.target or out.sent:
            yield out.batch()

    def snapshot(self, route: int, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        """A mirrored source's table snapshot (``route``'s rows as +I changes, at least the source node's
        columns: ``changelake.service.rebuild`` checked the table holds them) to the graph only: its table
        already holds them."""
        out = Envelopes(self.chain, -1)
        route_source(Router(self.chain), self.sources.get(route, ()), rows, out)
        if out.target or out.sent:
            yield out.batch()

    def _route(self, rows: Mapping[int, list[pa.Table]], out: Envelopes) -> None:
        router = Router(self.chain)
        for route, tables in rows.items():
            route_source(router, self.sources[route], pa.concat_tables(tables), out)


class RoutedStage:
    """A decode stage whose output is the chain's envelopes (:class:`SourceEnvelopes`): what the Kafka
    read tasks run when the pipeline has an operator graph. Pickled into every read task."""

    spark_schema = ENVELOPE

    def __init__(self, stage: Any, envelopes: SourceEnvelopes, snapshots: Mapping[int, Any] | None = None) -> None:
        self.stage, self.envelopes = stage, envelopes
        #: route -> its mirrored table's snapshot (``TableSnapshot``) for a rebuilt checkpoint's first batch
        self.snapshots = dict(snapshots or {})

    def snapshot(self, route: int) -> Iterator[pa.RecordBatch]:
        """A :class:`~changelake.spark.kafka_source.SnapshotTask`: the route's table snapshot as envelopes."""
        for batch in self.envelopes.snapshot(route, self.snapshots[route].changes()):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=_NULLABLE_ENVELOPE)

    def begin(self, epochs: dict) -> None:
        """The read task's partitions' epoch states at their start (:meth:`DecodeStage.begin`)."""
        self.stage.begin(epochs)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # a Python data source's batches must match its DDL's Arrow schema exactly: nullable columns
        chunks = self.stage.chunks(batches, tables=frozenset(self.envelopes.sources))
        for batch in self.envelopes.route_chunks(chunks):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=_NULLABLE_ENVELOPE)


_NULLABLE_ENVELOPE = pa.schema([f.with_nullable(True) for f in ENVELOPE_ARROW])


class _StageNode:
    """What a chain operator needs of one of its nodes to step its buckets."""

    def __init__(self, chain: Chain, node: PhysicalNode) -> None:
        self.id, self.config, self.output = node.id, node.config, node.schema
        self.kernel_cls = EncodedGlobalGroupAggregate if node.id in chain.two_phase else kernel_class(node)
        self.sides = [chain.side_schema(node, i) for i in range(len(node.inputs))]
        self.info = NodeInfo(node.id, node.late_rows == "dead_letter")
        self.event_time = node.op in EVENT_TIME_OPS


def processor_class():
    """The ``StatefulProcessor`` class of the chain's operators (pyspark imported when called)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class ChainProcessor(StatefulProcessor):
        """Operator ``stage`` of the chain: runs each of its nodes' kernels on their buckets, passes the
        rest on."""

        def __init__(self, chain: Chain, stage: int, clock) -> None:
            self.chain, self.stage, self.clock = chain, stage, clock
            self.nodes = {i: _StageNode(chain, chain.plan[chain.order[i]]) for i in chain.stages[stage]}

        def init(self, handle) -> None:
            self.state = handle.getValueState(STATE_KERNEL_SNAPSHOT, _STATE_SCHEMA)

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            g = int(key[0] if isinstance(key, tuple) else key)
            if g < 0:
                yield from self._pass(rows)
            else:
                at, bucket = self.chain.stage_bucket(self.stage, self.chain.groups.bucket(g))
                node = self.nodes[at]
                binding.CLOCK.start()
                frame = self._frame(self._kernel(node, bucket, rows))
                binding.CLOCK.tick("to_pandas")
                binding.CLOCK.write(node=node.id, bucket=bucket)
                yield frame

        def _pass(self, rows):
            """Envelopes for later operators, sinks and the driver: unchanged, regrouped for the next operator."""
            import pandas as pd

            for frame in rows:
                target = frame.iloc[:, 1].to_numpy(dtype=np.int16)
                bucket = frame.iloc[:, 2].to_numpy(dtype=np.int32)
                yield pd.DataFrame({"g": self.chain.next_group(target, bucket, self.stage + 1),
                                    "target": target,
                                    "bucket": bucket, "part": frame.iloc[:, 3].to_numpy(dtype=np.int8),
                                    "payload": frame.iloc[:, 4].to_numpy(dtype=object)})

        def _kernel(self, node: _StageNode, bucket: int, rows) -> pa.RecordBatch:
            envelopes = ((part, payload) for frame in rows
                         for part, payload in zip(frame.iloc[:, 3].tolist(), frame.iloc[:, 4].tolist()))
            result, sent = step_bucket(self.state, node.kernel_cls, node.config, node.sides, envelopes,
                                       node.output, node.info, bucket, now=self.clock(None),
                                       event_time=node.event_time)
            env = Envelopes(self.chain, self.stage)
            env.sent.extend(sent)
            if result.num_rows:
                Router(self.chain).route(node.id, with_positions(result), env)
            batch = env.batch()
            binding.CLOCK.tick("route")
            return batch

        @staticmethod
        def _frame(batch: pa.RecordBatch):
            return batch.to_pandas()

        def close(self) -> None:
            pass

    return ChainProcessor


class Deliver:
    """mapInArrow at the end of the chain: sink envelopes -> packed changes (``_route`` = the table's
    index, ``part`` = ``"changes"``); driver envelopes -> the decode stage's payloads they were; report
    envelopes -> the report channel."""

    def __init__(self, first_sink: int, channel: reports.ReportChannel | None) -> None:
        self.first_sink, self.channel = first_sink, channel

    def __call__(self, batches):
        from changelake.spark.decode_stage import PARTS, SCHEMA

        parts = pa.array(PARTS, pa.string())
        sent = []
        for batch in batches:
            target = batch.column(1)
            driver = batch.filter(pc.equal(target, DRIVER))
            if driver.num_rows:
                yield pa.RecordBatch.from_arrays([driver.column(2).cast(pa.int16()), parts.take(driver.column(3)),
                                                  driver.column(4)], schema=SCHEMA)
            if self.channel is not None:
                for payload in batch.filter(pc.equal(target, REPORTS)).column(4).to_pylist():
                    sent.extend(reports.decode(payload))
            mine = batch.filter(pc.greater_equal(target, self.first_sink))
            if mine.num_rows:
                route = pc.subtract(mine.column(1), pa.scalar(self.first_sink, pa.int16()))
                yield pa.RecordBatch.from_arrays(
                    [route, pa.array([CHANGES_PART] * mine.num_rows), mine.column(4)], schema=SCHEMA)
        if self.channel is not None:
            self.channel.send(sent)


def _processing_time(timer_values) -> int:
    import time

    # Wall clock, not timerValues: timeMode "ProcessingTime" makes Spark schedule a no-data batch
    # after every batch, so an availableNow query never ends (pyspark 4.2.0).
    return int(time.time() * 1000)


def compile_chain(plan: PhysicalPlan, sources: Mapping[str, Any], *, buckets: int | Mapping[str, int],
                  default_buckets: int, channel: reports.ReportChannel | None, two_phase: bool,
                  groups: GroupLayout | None = None):
    """The packed changes of every sink table (``_route``, ``part``, ``payload``), through one chain of
    ``transformWithStateInPandas`` operators, one per level of the graph with a per-level ``groups``
    layout, else one per stateful node (:attr:`Chain.stages`), from one typed streaming DataFrame per
    source; and the table of each ``_route``."""
    chain = Chain.of(plan, buckets, default_buckets, two_phase, groups)
    env = None
    for source, nodes in source_nodes(plan).items():
        routed = sources[source].mapInArrow(SourceRouter(chain, nodes), ENVELOPE)
        env = routed if env is None else env.unionByName(routed)
    if env is None:
        raise ConfigError("the plan reads no source")
    return run_chain(chain, env, channel), [plan[s].table for s in chain.sinks]


def source_nodes(plan: PhysicalPlan) -> dict[str, list[str]]:
    """Source name -> the ids of the plan's source nodes reading it."""
    by_source: dict[str, list[str]] = {}
    for node in plan.sources:
        by_source.setdefault(node.source, []).append(node.id)
    return by_source


def run_chain(chain: Chain, env: Any, channel: reports.ReportChannel | None) -> Any:
    """The chain's operators over ``env`` (a streaming DataFrame of ``ENVELOPE`` rows: the sources'
    envelopes, and any addressed to the driver), delivered as the decode stage's schema: the sink
    tables' packed changes and the driver's payloads."""
    from changelake.spark.decode_stage import SPARK_SCHEMA

    plan = chain.plan
    cls = processor_class()
    for stage, nodes in enumerate(chain.stages):
        node_id = chain.order[nodes[0]]
        if plan[node_id].op == "lookup_join":
            env = (env.repartition(chain.buckets[node_id], "g")
                   .mapInArrow(LookupStage(chain, stage), ENVELOPE))
            continue
        env = (env.groupBy("g")
               .transformWithStateInPandas(statefulProcessor=cls(chain, stage, _processing_time),
                                           outputStructType=ENVELOPE, outputMode="Append", timeMode="None"))
    return env.mapInArrow(Deliver(len(chain.order), channel), SPARK_SCHEMA)
