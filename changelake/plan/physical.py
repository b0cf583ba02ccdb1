"""The physical plan: what the planner hands to an executor (in-process or Spark).

A :class:`PhysicalPlan` is a DAG of :class:`PhysicalNode` in topological order. Every node
knows its output columns (Arrow schema, user columns only: the reserved ``_kind`` travels
beside them), the row kinds it emits (its changelog mode, after the planner decided
whether ``-U`` is needed downstream) and its upsert key. Stateful nodes carry a kernel
class and its config (column positions refer to the node's input schema(s)); an executor
runs ``kernel(config)`` over the input changelog, partitioned by ``state_keys``.

Executors must honour, per node kind (``op``):

==============  ==========================================================================
``source``      the decoded rows of source ``source`` (its declared columns); with a primary key
                (``upsert_key``), an update that changed it is a move: ``-D`` old, ``+I`` new
                (:func:`changelake.key_changes.split_key_changes`; on Spark the service's
                decode stage has split them, ``LocalRunner`` splits them itself)
``normalize``   ``Deduplicate`` keep-last on arrival, keyed by the source's primary key:
                drop the input's ``-U`` rows first (``drop_update_before``), so a
                re-delivered change is suppressed as a no-op (Flink's ChangelogNormalize)
``deduplicate`` ``Deduplicate`` kernel
``aggregate``   ``GroupAggregate`` kernel
``join``        ``StreamingJoin`` / ``StreamingSemiAntiJoin``: two inputs (left, right);
                ``state_keys`` gives each side's join key columns, equal values of which
                must meet in the same kernel instance
``interval_join`` ``IntervalJoin``: two insert-only inputs bucketed by join key, as ``join``;
                ``time_columns`` are the inputs' event-time columns; every bucket must see
                heartbeats of the other buckets' event times (see ``operators/_event_time``);
                the kernel's late rows (kinds 5 and 7) leave the changelog for the late path
``temporal_join`` ``TemporalJoin``: facts (left) and a versioned changelog (right), as
                ``interval_join``; drops the right input's -U (``drop_update_before``)
``rank``        Top-N kernel built by ``make_rank(config)``
``materialize`` ``SinkUpsertMaterializer`` keyed by the sink's primary key
``lookup_join`` ``LookupJoiner(config)`` per worker, its cache kept across micro-batches (no
                state): each row joined with its key's dimension row (``config.lookup``),
                kinds kept; on Spark the input is partitioned by ``state_keys`` (the
                stream's lookup key columns) so a key's rows meet one cache
``filter``      keep rows for which the SQL predicate ``predicate`` is true (row kinds kept)
``project``     SQL expressions ``projections`` ((name, expression) pairs), row kinds kept
``sink``        apply the input changelog to Delta table ``table`` (:func:`sink_changes`)
==============  ==========================================================================

``state_keys`` holds, per input, the column names whose values partition the node's state
(an empty tuple: one partition, e.g. a global aggregate). Rows of one key must reach the
same kernel instance in their order of arrival. A NULL key value is a key like any other
(SQL's GROUP BY and PARTITION BY give NULL a group of its own); only a join's equi-key NULL
matches nothing. ``not_null`` lists the columns no row holds NULL in
(:mod:`changelake.plan.nullability`); a sink's ``nullable_key`` are the table key columns
that may hold NULL, which the Delta sink then matches null-safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, RowKind, with_batch_seq
from changelake.operators.changelog_mode import ChangelogMode

Op = Literal["source", "normalize", "deduplicate", "aggregate", "join", "interval_join", "temporal_join", "rank",
             "materialize", "lookup_join", "filter", "project", "sink"]
#: ops whose node runs a kernel with keyed state
STATEFUL_OPS = frozenset({"normalize", "deduplicate", "aggregate", "join", "interval_join", "temporal_join", "rank",
                          "materialize"})
#: ops with two inputs (left, right) whose kernel takes ``process(rows, side=...)``
TWO_INPUT_OPS = frozenset({"join", "interval_join", "temporal_join"})
#: ops that follow the event time of their inputs (``time_columns``), with heartbeats and late rows
EVENT_TIME_OPS = frozenset({"interval_join", "temporal_join"})


@dataclass(frozen=True)
class PhysicalNode:
    id: str
    op: Op
    inputs: tuple[str, ...]
    schema: pa.Schema
    mode: ChangelogMode
    upsert_key: tuple[str, ...] | None
    kernel: Any = None                      # kernel class, or make_rank for "rank"
    config: Any = None                      # the kernel's config
    state_keys: tuple[tuple[str, ...], ...] = ()
    drop_update_before: bool = False        # drop the input's -U rows before the kernel
    predicate: str | None = None            # filter
    projections: tuple[tuple[str, str], ...] = ()   # project: (output column, SQL expression)
    source: str | None = None               # source: the SourceSpec name
    table: str | None = None                # sink: the table name
    primary_key: tuple[str, ...] = ()       # sink: the table's primary key
    time_columns: tuple[str, ...] = ()      # interval / temporal join: each input's event-time column
    late_rows: str = "drop"                 # interval / temporal join: "drop" or "dead_letter"
    append_only: bool = False               # source: declared insert-only
    state_layout: str = ""                  # what the state holds, for explain
    note: str = ""                          # why the planner added or changed the node
    not_null: frozenset[str] = frozenset()  # columns no row holds NULL in (plan.nullability)

    @property
    def stateful(self) -> bool:
        return self.op in STATEFUL_OPS

    @property
    def nullable_key(self) -> tuple[str, ...]:
        """Sink: the table's key columns that may hold NULL (a NULL group or partition key)."""
        return tuple(k for k in self.primary_key if k not in self.not_null)

    def make_kernel(self):
        """A fresh kernel for this node (stateful nodes; a lookup join's joiner)."""
        return self.kernel(self.config)


@dataclass(frozen=True)
class PhysicalPlan:
    nodes: tuple[PhysicalNode, ...]         # topological order: inputs before their consumers
    by_id: dict[str, PhysicalNode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {n.id: n for n in self.nodes})

    def __iter__(self) -> Iterator[PhysicalNode]:
        return iter(self.nodes)

    def __getitem__(self, node_id: str) -> PhysicalNode:
        return self.by_id[node_id]

    @property
    def sources(self) -> list[PhysicalNode]:
        return [n for n in self.nodes if n.op == "source"]

    @property
    def sinks(self) -> list[PhysicalNode]:
        return [n for n in self.nodes if n.op == "sink"]

    def consumers(self, node_id: str) -> list[PhysicalNode]:
        return [n for n in self.nodes if node_id in n.inputs]

    def source_of(self, node_id: str, side: str = "left") -> str:
        """The source that input ``side`` (left, right) of ``node_id`` descends from (its first input at every
        step up)."""
        node = self[self[node_id].inputs[0 if side == "left" else 1]]
        while node.op != "source":
            node = self[node.inputs[0]]
        return node.source


def sink_changes(changes: pa.Table, *, primary_key: Sequence[str], batch_id: int, generation: int = 0) -> pa.Table:
    """A sink node's output of one micro-batch, ready for the Delta upsert sink.

    ``changes`` must list each key's changes in order. They get a ``_seq`` from the batch's commit
    position (checkpoint generation and batch id) and their position, and a key whose last change is a ``-U`` gets that row as a ``-D``: the row
    was retracted and no ``+U`` replaced it under this key (the sink ignores ``-U``, which is
    right for a before-image followed by its after-image, not for an operator's retraction whose
    new row went to another key or was filtered out).
    """
    out = with_batch_seq(changes, batch_id, generation)
    kinds = out[KIND]
    ub = pa.scalar(int(RowKind.UPDATE_BEFORE), pa.int8())
    if out.num_rows == 0 or not pc.any(pc.equal(kinds, ub)).as_py():
        return out
    positions = out.select(list(primary_key)).append_column("pos", pa.array(np.arange(out.num_rows)))
    last = positions.group_by(list(primary_key), use_threads=False).aggregate([("pos", "max")])["pos_max"]
    lone = pc.filter(last, pc.equal(pc.take(kinds, last), ub)).to_numpy()
    mask = np.zeros(out.num_rows, dtype=bool)
    mask[lone] = True
    fixed = pc.if_else(pa.array(mask), pa.scalar(int(RowKind.DELETE), pa.int8()), kinds)
    return out.set_column(out.schema.get_field_index(KIND), KIND, fixed)
