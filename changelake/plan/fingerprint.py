"""Fingerprints of a physical plan: what a checkpoint was created for, to tell a changed view at start.

================  ===================================================================================
fingerprint       covers
================  ===================================================================================
a table's         every node upstream of the graph table's sink node (the views that compute it): id,
                  kind, inputs, columns and types, keys, the kernel's settings, predicates and
                  expressions. Changes when a view the table reads is added, removed or edited.
the state's       every node of the plan but the sinks, in plan order, and each stateful node's bucket
                  count: where the operators' state sits in a checkpoint (one operator per level of
                  the graph, a node's range of buckets in it; docs/state-design.md). Any change moves
                  state, so a checkpoint only continues the plan it was created for.
================  ===================================================================================

A fingerprint is the SHA-256 of a canonical text of the nodes (16 hex digits kept); nothing in it
depends on the process (object addresses are removed from the kernels' settings).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from changelake.plan.physical import PhysicalNode, PhysicalPlan

__all__ = ["node_text", "state_fingerprint", "table_fingerprints"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def node_text(node: PhysicalNode) -> str:
    """The canonical text of one node: everything that decides what it emits and what state it keeps."""
    schema = ",".join(f"{f.name}:{f.type}" for f in node.schema)
    config = _ADDRESS.sub("", repr(node.config)) if node.config is not None else ""
    kernel = getattr(node.kernel, "__qualname__", "") if node.kernel is not None else ""
    return "|".join(str(part) for part in (
        node.id, node.op, node.inputs, schema, node.upsert_key, node.state_keys, node.drop_update_before,
        node.predicate, node.projections, node.source, node.table, node.primary_key, node.time_columns,
        node.late_rows, node.append_only, kernel, config))


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def table_fingerprints(plan: PhysicalPlan) -> dict[str, str]:
    """Graph table -> the fingerprint of the nodes that compute it (module docstring)."""
    out = {}
    for sink in plan.sinks:
        upstream: set[str] = set()
        stack = [sink.id]
        while stack:
            node_id = stack.pop()
            if node_id not in upstream:
                upstream.add(node_id)
                stack.extend(plan[node_id].inputs)
        out[sink.table] = _digest([node_text(n) for n in plan if n.id in upstream])
    return out


def state_fingerprint(plan: PhysicalPlan, buckets: int | Mapping[str, int], default: int) -> str:
    """The fingerprint of where the plan's operator state sits (module docstring); ``buckets``: each
    stateful node's bucket count, or one for all (``default`` for a node a mapping does not name)."""
    lines = []
    for node in plan:
        if node.op == "sink":
            continue
        n = (buckets.get(node.id, default) if isinstance(buckets, Mapping) else buckets) if node.stateful else 0
        lines.append(f"{node_text(node)}|buckets={n}")
    return _digest(lines)
