"""Which columns of a plan node are never NULL, and so which table key columns may be.

SQL gives NULL a group of its own (a NULL ``group_by`` key is one group, a NULL
``partition_by`` one Top-N partition), so such a key may reach a table. The planner
tells each table which of its key columns may hold NULL (``nullable_key`` of the
sink node); the Delta sink matches those null-safely and rejects NULL in the others.
A column is never NULL only when a rule below says so; everything else may be::

    source                      its primary key (a change whose key is NULL is a dead letter)
    normalize, deduplicate,     the input's
      materialize, sink
    filter                      the input's, plus the columns its predicate rejects NULL in
                                (a top-level AND of IS NOT NULL, comparisons, IN: sql.null_rejected)
    project                     outputs that are a never-NULL column, a non-NULL constant, or a
                                COALESCE with such an argument (sql.never_null)
    aggregate                   group keys never NULL in the input; COUNT outputs
    rank                        the input's; the rank number
    join, interval_join,        INNER: both inputs' and both join keys (NULL matches nothing);
      temporal_join             LEFT: the left input's; RIGHT: the right input's; FULL: none;
                                SEMI: the left input's and its join key; ANTI: the left input's
    lookup_join                 the input's; INNER also its lookup key columns

Being wrong in the safe direction only costs speed (a null-safe MERGE where a plain one
would do); the other way a NULL would fail the table's batch, so each rule is exact or
conservative.
"""

from __future__ import annotations

from collections.abc import Sequence

from changelake.plan import sql
from changelake.plan.physical import PhysicalNode

_PASS_THROUGH = frozenset({"normalize", "deduplicate", "materialize", "sink"})
_JOINS = frozenset({"join", "interval_join", "temporal_join"})


def not_null_columns(node: PhysicalNode, inputs: Sequence[PhysicalNode]) -> frozenset[str]:
    """The output columns of ``node`` that no row holds NULL in (``inputs``: its finished input nodes)."""
    op, names = node.op, set(node.schema.names)
    if op == "source":
        return frozenset(node.upsert_key or ())
    if op in _PASS_THROUGH:
        return inputs[0].not_null
    if op == "filter":
        return inputs[0].not_null | (sql.null_rejected(node.predicate or "") & names)
    if op == "project":
        return frozenset(name for name, expr in node.projections if sql.never_null(expr, inputs[0].not_null))
    if op == "aggregate":
        group_by = node.state_keys[0]
        counts = [name for name, call in zip(node.schema.names[len(group_by):], node.config.aggregates)
                  if isinstance(call.function, str) and call.function.upper() == "COUNT"]
        return frozenset(c for c in group_by if c in inputs[0].not_null) | frozenset(counts)
    if op == "rank":
        rank_number = (node.schema.names[-1],) if node.config.output_rank_number else ()
        return inputs[0].not_null | frozenset(rank_number)
    if op in _JOINS:
        return _joined(node, inputs[0], inputs[1])
    if op == "lookup_join":
        keys = node.config.stream_keys if node.config.join_type == "INNER" else ()
        return inputs[0].not_null | frozenset(keys)
    return frozenset()


def _joined(node: PhysicalNode, left: PhysicalNode, right: PhysicalNode) -> frozenset[str]:
    """A join's never-NULL columns; the right input's columns are renamed in the output by position."""
    how = node.config.join_type
    lkey, rkey = node.state_keys
    if how in ("SEMI", "ANTI"):
        return left.not_null | (frozenset(lkey) if how == "SEMI" else frozenset())
    out_name = dict(zip(right.schema.names, node.schema.names[len(left.schema):]))
    left_side = left.not_null | frozenset(lkey)
    right_side = frozenset(out_name[c] for c in right.not_null | frozenset(rkey))
    if how == "INNER":
        return left_side | right_side
    if how == "LEFT":
        return left.not_null
    if how == "RIGHT":
        return frozenset(out_name[c] for c in right.not_null)
    return frozenset()
