"""Run a physical plan in this process, one micro-batch at a time.

For tests, notebooks and small jobs: every stateful node is one kernel instance holding
all keys, so there is no shuffle and no Spark; every lookup join is one joiner whose cache
lives as long as the runner (:meth:`close` closes its connections). The state is in memory;
:meth:`snapshot` and :meth:`restore` carry it across a restart (the Spark executor keeps the same kernel
state in the checkpointed RocksDB store instead). Outputs are what the Spark executor
computes for the same input, per key and in order.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ, RowKind
from changelake.key_changes import split_key_changes
from changelake.metrics import publish
from changelake.operators._event_time import split_late
from changelake.operators.lookup_join import observe
from changelake.plan import sql
from changelake.plan.physical import (
    EVENT_TIME_OPS,
    TWO_INPUT_OPS,
    PhysicalNode,
    PhysicalPlan,
)


def changelog_of(node: PhysicalNode, table: pa.Table | None) -> pa.Table:
    """``table``'s user columns of ``node``'s schema plus ``_kind`` (an empty batch for None)."""
    schema = node.schema.append(pa.field(KIND, pa.int8()))
    if table is None:
        return schema.empty_table()
    return table.select(schema.names).cast(schema)


def without_update_before(table: pa.Table) -> pa.Table:
    return table.filter(pc.not_equal(table[KIND], pa.scalar(int(RowKind.UPDATE_BEFORE), pa.int8())))


class LocalRunner:
    """``runner.step({"orders": batch, ...})`` -> ``{"table": changelog}`` per sink table."""

    #: whether the sources' rows keep their ``_seq`` (their source position) through filters and projections
    #: into the first operators, as on the executors, so that a row an operator raises on names its position
    carry_seq = False

    def __init__(self, plan: PhysicalPlan) -> None:
        self.plan = plan
        self.kernels = {n.id: n.make_kernel() for n in plan if n.stateful}
        self.joiners = {n.id: n.make_kernel() for n in plan if n.op == "lookup_join"}
        #: node id -> late rows of the time-bounded joins (``_kind`` 5: left input, 7: right), as emitted
        self.late: dict[str, list[pa.Table]] = {}
        #: source -> updates that changed its primary key (split into -D, +I at the source node)
        self.key_changes: dict[str, int] = {}

    def step(self, inputs: Mapping[str, pa.Table], *, now: int = 0) -> dict[str, pa.Table]:
        """Feed one micro-batch (decoded changelogs by source name); returns each table's changes."""
        unknown = set(inputs) - {n.source for n in self.plan.sources}
        if unknown:
            raise KeyError(f"no source named {sorted(unknown)}; sources are {[n.source for n in self.plan.sources]}")
        outs: dict[str, pa.Table] = {}
        for node in self.plan:
            ins = [outs[i] for i in node.inputs]
            if node.op == "source":
                outs[node.id] = self._source_step(node, inputs.get(node.source))
            elif node.op == "filter":
                outs[node.id] = sql.apply_filter(ins[0], node.predicate)
            elif node.op == "project":
                projected = sql.apply_project(ins[0], node.projections, node.schema)
                outs[node.id] = (projected.append_column(SEQ, ins[0][SEQ]) if SEQ in ins[0].column_names
                                 else projected)
            elif node.op == "sink":
                outs[node.id] = ins[0]
            elif node.op == "lookup_join":
                joiner = self.joiners[node.id]
                outs[node.id] = changelog_of(node, joiner.join(ins[0]))
                observe(joiner.lookup.name, joiner.take_stats())
            else:
                outs[node.id] = self._kernel_step(node, ins, now)
        return {n.table: outs[n.id] for n in self.plan.sinks}

    def _source_step(self, node: PhysicalNode, table: pa.Table | None) -> pa.Table:
        """A source's decoded rows with its key changes split by its primary key (as the service's decode
        stage does on Spark), as the source node's changelog."""
        if table is not None and node.upsert_key is not None and not node.append_only:
            split = split_key_changes(table, node.upsert_key)
            if split.moves:
                self.key_changes[node.source] = self.key_changes.get(node.source, 0) + split.moves
            table = split.changes
        out = changelog_of(node, table)
        if self.carry_seq and table is not None and SEQ in table.column_names:
            out = out.append_column(SEQ, table[SEQ])
        return out

    def _kernel_step(self, node: PhysicalNode, ins: list[pa.Table], now: int) -> pa.Table:
        if node.drop_update_before:
            ins = [without_update_before(t) for t in ins]
        table = self._run_kernel(node, ins, now)
        if node.op in EVENT_TIME_OPS:
            table, late = split_late(table)
            if late.num_rows:
                self.late.setdefault(node.id, []).append(late)
        return table

    def _run_kernel(self, node: PhysicalNode, ins: list[pa.Table], now: int) -> pa.Table:
        """The node's kernel over the step's inputs (its state changed in place): its output changelog."""
        kernel = self.kernels[node.id]
        if node.op in TWO_INPUT_OPS:
            out = kernel.process(ins[0], side="left", now=now)
            out.extend(kernel.process(ins[1], side="right", now=now))
        else:
            out = kernel.process(ins[0], now=now)
        out.extend(kernel.finish(now=now))
        publish(kernel.take_figures())       # this process's registry: the runner runs in it
        return out.to_arrow(node.schema)

    def close(self) -> None:
        """Close the lookup joins' connections and threads."""
        for joiner in self.joiners.values():
            joiner.close()

    def snapshot(self) -> dict[str, bytes]:
        return {node_id: k.snapshot() for node_id, k in self.kernels.items()}

    def restore(self, snapshot: Mapping[str, bytes]) -> None:
        for node in self.plan:
            if node.stateful:
                self.kernels[node.id] = type(self.kernels[node.id]).restore(node.config, snapshot[node.id])
