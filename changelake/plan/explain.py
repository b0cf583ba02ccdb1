"""A physical plan as text, like Flink's ``EXPLAIN CHANGELOG_MODE``: one tree per table sink,
each node with its changelog mode, upsert key and what its state holds; a table whose key
columns may hold NULL (a NULL group or partition key, see ``plan.nullability``) lists them
as ``nullableKey``."""

from __future__ import annotations

from changelake.plan.physical import PhysicalNode, PhysicalPlan

_NAMES = {"source": "Source", "normalize": "ChangelogNormalize", "deduplicate": "Deduplicate",
          "aggregate": "GroupAggregate", "join": "Join",
          "interval_join": "IntervalJoin", "temporal_join": "TemporalJoin", "rank": "Rank", "materialize": "SinkUpsertMaterializer",
          "lookup_join": "LookupJoin", "filter": "Filter", "project": "Calc", "sink": "Sink"}


def describe(node: PhysicalNode) -> str:
    """One line: operator, its arguments, changelog mode, upsert key, state."""
    args = [f"name=[{node.id}]"]
    c = node.config
    if node.op == "source":
        args.append(f"columns=[{', '.join(node.schema.names)}]")
        if node.append_only:
            args.append("appendOnly=[true]")
        elif node.upsert_key:
            args.append(f"keyChanges=[{', '.join(node.upsert_key)} changed: -D old, +I new]")
    elif node.op == "sink":
        args.append(f"table=[{node.table}], primaryKey=[{', '.join(node.primary_key)}]")
        if node.nullable_key:
            args.append(f"nullableKey=[{', '.join(node.nullable_key)}]")
    elif node.op == "filter":
        args.append(f"where=[{node.predicate}]")
    elif node.op == "project":
        args.append("select=[" + ", ".join(n if e in (n, f"`{n}`") else f"{e} AS {n}" for n, e in node.projections)
                    + "]")
    elif node.op in ("join", "interval_join", "temporal_join"):
        args.append(f"joinType=[{c.join_type}]")
        if node.op != "join":
            left, right = node.state_keys
            args.append("on=[" + ", ".join(f"{a} = {b}" for a, b in zip(left, right)) + "]")
            args.append(f"time=[{node.time_columns[0]}, {node.time_columns[1]}]")
    elif node.op == "lookup_join":
        lk = c.lookup
        args.append(f"lookup=[{lk.name}], table=[{lk.where()}], key=[{', '.join(lk.key)}], joinType=[{c.join_type}]")
        args.append("on=[" + " AND ".join(f"{a} = {lk.name}.{b}" for a, b in zip(c.stream_keys, c.dim_keys)) + "]")
        args.append(f"batchSize=[{lk.batch_size}], maxConcurrency=[{lk.max_concurrency}]")
    elif node.op == "aggregate":
        args.append(f"groupBy=[{', '.join(node.state_keys[0])}]")
        args.append("select=[" + ", ".join(node.schema.names) + "]")
    elif node.op == "rank":
        args.append(f"strategy=[{c.strategy}], rankRange=[1..{c.rank_end}], "
                    f"partitionBy=[{', '.join(node.state_keys[0])}], rankNumber=[{c.output_rank_number}]")
    if node.drop_update_before:
        args.append("dropsInput=[-U]")
    line = f"{_NAMES[node.op]}({', '.join(args)}) changelogMode=[{','.join(k.short for k in sorted(node.mode.kinds))}]"
    if node.upsert_key is not None and node.op != "sink":
        line += f" upsertKey=[{', '.join(node.upsert_key)}]"
    if node.state_layout:
        line += f" state=[{node.state_layout}]"
        ttl = getattr(c, "state_ttl_ms", None) or getattr(c, "left_state_ttl_ms", 0)
        if ttl:
            line += f" stateTtl=[{ttl} ms]"
    if node.note:
        line += f"  -- {node.note}"
    return line


def explain_plan(plan: PhysicalPlan) -> str:
    out: list[str] = []

    def walk(node: PhysicalNode, prefix: str, child_prefix: str) -> None:
        out.append(prefix + describe(node))
        for i, inp in enumerate(node.inputs):
            last = i == len(node.inputs) - 1
            walk(plan[inp], child_prefix + ("+- " if last else ":- "), child_prefix + ("   " if last else ":  "))

    for sink in plan.sinks:
        walk(sink, "", "")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
