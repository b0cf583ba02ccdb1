"""The operator graph behind the transaction gate: views of a pipeline with ``consistency: transaction``.

On Spark the views run on the executors, in the streaming query, before the driver sees a row; the gate
(:mod:`changelake.service.transactions`) decides on the driver which rows of a batch are of complete source
transactions. So that every view, like every mirror, moves only from the state after one source transaction
to the state after a later one, a pipeline with a source of ``consistency: transaction`` runs its graph on
the driver, after the gate, over the released rows only (held rows go in with the batch that completes
their transaction):

=====================================  ==========================================================
step of a batch                        where
=====================================  ==========================================================
read, decode, split key changes        the executors (the decode stage), as without the gate
hold the rows of incomplete            the driver (the gate): graph sources' rows and mirrors'
transactions                           rows alike
the views' operators                   the driver: :class:`~changelake.plan.local.LocalRunner`,
                                       one kernel per stateful node, over the released rows
their state                            in memory, and with the gate's state in the checkpoint
                                       (``<checkpoint>/transactions/<batch id>/graph/``), written
                                       before the batch's commits: a replayed batch starts from
                                       the state an earlier batch left, as the gate does
=====================================  ==========================================================

The cost: the operators run in one process, and every batch writes their whole state to the checkpoint,
so this suits views whose state is small to moderate (docs/pipelines.md, "Transaction-consistent tables").

A row an operator raises on is set aside as on the executors (:func:`~changelake.spark.binding.
run_bucket_isolating`: the node's rows halved down to the rows that make it raise, each half run from the
state the half before it left) and reported in :attr:`DriverGraph.rejected`, which the batch turns into
``operator-error`` dead letters of the source it descends from, under that source's ``on_error``: one bad
row never stops the pipeline in a loop. A source's rows keep their ``_seq`` into the first operators, as on
the executors, so the letter of a row a first operator raises on names its source position and the Kafka
message it was decoded from (topic, partition, offset); a deeper operator's input is another operator's
output, which has no message: its letter holds the row only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import OFFSET, PARTITION, SEQ, TOPIC
from changelake.errors import StateError
from changelake.metrics import publish
from changelake.plan.local import LocalRunner
from changelake.plan.physical import TWO_INPUT_OPS, PhysicalNode, PhysicalPlan
from changelake.spark import reports
from changelake.spark.binding import NodeInfo, late_reports, poisoned_reports, run_bucket_isolating, with_positions


class _IsolatingRunner(LocalRunner):
    """:class:`LocalRunner` whose kernels set aside the rows they raise on (module docstring)."""

    carry_seq = True

    def __init__(self, plan: PhysicalPlan) -> None:
        super().__init__(plan)
        #: the rows the operators raised on in the last step
        self.rejected: list[reports.Rejected] = []
        #: node id -> its kernel's state before the step (its snapshot; absent: a fresh kernel)
        self.before: Mapping[str, bytes] = {}

    def _run_kernel(self, node: PhysicalNode, ins: list[pa.Table], now: int) -> pa.Table:
        try:
            return super()._run_kernel(node, ins, now)
        except StateError:          # a policy's deliberate stop
            raise
        except Exception:  # noqa: BLE001 - run again from the state before, the bad rows set aside
            pass
        kernel = self.kernels[node.id]
        rows = (ins[0], ins[1]) if node.op in TWO_INPUT_OPS else ins[0]
        step, bad = run_bucket_isolating(type(kernel), node.config, self.before.get(node.id), rows, node.schema,
                                         now=now)
        self.kernels[node.id] = step.kernel if step.kernel is not None else type(kernel).restore(
            node.config, step.snapshot) if step.snapshot is not None else node.make_kernel()
        publish(step.figures)
        self.rejected.extend(poisoned_reports(NodeInfo(node.id, node.late_rows == "dead_letter"), bad))
        return step.out


class DriverGraph:
    """``step({source: [decoded rows]})`` -> ``{graph table: changes}`` with ``_seq`` (each table's changes
    in the order the last operator emitted them, as the executors' chain delivers them)."""

    def __init__(self, plan: PhysicalPlan) -> None:
        self.plan = plan
        self.runner = _IsolatingRunner(plan)
        #: (view, side) -> (late rows, their JSON when the view dead-letters them) of the last step
        self.late: dict[tuple[str, str], tuple[int, list[str]]] = {}
        #: the rows an operator raised on in the last step (``operator-error`` dead letters)
        self.rejected: list[reports.Rejected] = []
        #: whether a step ran since the last :meth:`snapshot` (then the runner's state before is not saved)
        self._unsaved = False

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(n.source for n in self.plan.sources)

    def step(self, feeds: Mapping[str, Sequence[pa.Table]], *, now_ms: int) -> dict[str, pa.Table]:
        """``now_ms``: the batch's processing time (state TTL), the gate's batch clock: a replay repeats it."""
        inputs = {s: pa.concat_tables(parts, promote_options="permissive") for s, parts in feeds.items() if parts}
        if self._unsaved:           # the state before the step, for a kernel that raises (the gate saves it anyway)
            self.runner.before = self.runner.snapshot()
        self.runner.late, self.runner.rejected = {}, []
        self._unsaved = True
        outs = self.runner.step(inputs, now=now_ms)
        self.late, self.rejected = self._late(), [_with_message(r, inputs.get(self.plan.source_of(r.node, r.side)))
                                                  for r in self.runner.rejected]
        return {table: _with_positions(changes) for table, changes in outs.items() if changes.num_rows}

    def _late(self) -> dict[tuple[str, str], tuple[int, list[str]]]:
        """The late rows of the step per (view, side), as the executors' binding reports them."""
        out = {}
        for node_id, parts in self.runner.late.items():
            info = NodeInfo(node_id, self.plan[node_id].late_rows == "dead_letter")
            for late in late_reports(info, pa.concat_tables(parts)):
                out[(late.node, late.side)] = (late.count, list(late.rows))
        return out

    def snapshot(self) -> dict[str, bytes]:
        """The operators' state (also what a kernel raising in the next step runs again from)."""
        self.runner.before = taken = self.runner.snapshot()
        self._unsaved = False
        return taken

    def restore(self, snapshot: Mapping[str, bytes] | None) -> None:
        """The state an earlier batch left (None: before the first batch)."""
        self.close()
        self.runner = _IsolatingRunner(self.plan)
        if snapshot is not None:
            self.runner.restore(snapshot)
            self.runner.before = snapshot
        self._unsaved = False


    def close(self) -> None:
        """Close the lookup joins' connections and threads (the runner's)."""
        self.runner.close()


def _with_message(rejected: reports.Rejected, source_rows: pa.Table | None) -> reports.Rejected:
    """``rejected`` with the Kafka message its row was decoded from: the row of its source (``source_rows``:
    the step's) with the same ``_seq`` (two sources' Kafka positions can be equal, one source's never)."""
    if (rejected.seq is None or source_rows is None
            or not {SEQ, TOPIC, PARTITION, OFFSET} <= set(source_rows.column_names)):
        return rejected
    hit = source_rows.filter(pc.equal(source_rows[SEQ], rejected.seq))
    if not hit.num_rows:
        return rejected
    return dataclasses.replace(rejected, message=(hit[TOPIC][0].as_py(), hit[PARTITION][0].as_py(),
                                                  hit[OFFSET][0].as_py()))


def _with_positions(changes: pa.Table) -> pa.Table:
    """The emission order as ``_seq`` (the executors' binding's positions, in place of any ``_seq``)."""
    return with_positions(changes.drop_columns([SEQ]) if SEQ in changes.column_names else changes)
