"""``changelake explain``: the pipeline's operator graph with each node's changelog mode.

Tables that sources mirror come first (decode -> upsert sink); the operator graph of
``views`` and ``tables[].from`` follows as the planner decided it
(:mod:`changelake.plan.explain`), with each node's changelog mode, upsert key and state.
Both say how an update that changes a primary key is applied (``keyChanges``), and the last
lines how each format reports one (:mod:`changelake.key_changes`).
"""

from __future__ import annotations

from typing import Any

from changelake.key_changes import REPORTED_AS
from changelake.plan.explain import explain_plan
from changelake.service.views import pipeline_from_config
from changelake.service.config import ChangelakeConfig


def explain(config: ChangelakeConfig) -> str:
    lines = [f"pipeline {config.pipeline.id}  (checkpoint {config.pipeline.checkpoint})", ""]
    for table in config.tables:
        mirrors = [s for s in config.sources if s.table == table.name]
        if not mirrors:
            continue
        lines.append(f"Sink(table=[{table.name}], path=[{config.table_path(table.name)}], "
                     f"primaryKey=[{', '.join(table.primary_key or ['(from the message keys)'])}]) needs [+I,+U,-D] (upsert by key, newest _seq "
                     f"wins, tombstones kept {table.tombstone_retention})")
        for i, s in enumerate(mirrors):
            branch, cont = ("+- ", "   ") if i == len(mirrors) - 1 else (":- ", ":  ")
            what = f"topics=[{', '.join(s.topics)}]" if s.topics else f"topicPattern=[{s.topic_pattern}]"
            key = ", ".join(table.primary_key or ["the key"])
            lines.append(f"{branch}Decode(format=[{s.format}], source=[{s.name}], onError=[{s.on_error}], "
                         f"keyChanges=[{key} changed: -D old, +I new]) changelogMode=[+I,-U,+U,-D]")
            lines.append(f"{cont}+- KafkaSource({what}, startingOffsets=[{_starting(s.starting_offsets)}]) "
                         "changelogMode=[+I] (raw records)")
        lines.append("")
    for s in config.sources:
        if s.route is not None:
            lines.extend(_routes(config, s))
    graph = pipeline_from_config(config)
    keyed = {s.name for s in config.sources if s.table is not None or s.route is not None}
    if graph is not None:
        plan = graph.plan()
        lines.append(explain_plan(plan))
        keyed |= {n.source for n in plan.sources if n.upsert_key and not n.append_only}
    formats = sorted({s.format for s in config.sources if s.name in keyed})
    if formats:
        lines.append("")
        lines.append("keyChanges: an update whose primary key differs before and after is applied as a -D of the old "
                     "key, then a +I of the new one, at the update's _seq. The formats report one as:")
        lines.extend(f"  {f}: {REPORTED_AS[f]}" for f in formats)
    return "\n".join(lines).rstrip() + "\n"


def _routes(config: ChangelakeConfig, s: Any) -> list[str]:
    """A routed source: its rules in the order they are tried, each with the table it names."""
    what = f"topics=[{', '.join(s.topics)}]" if s.topics else f"topicPattern=[{s.topic_pattern}]"
    lines = [f"Route(source=[{s.name}], format=[{s.format}], onError=[{s.on_error}]) each change to the table its "
             "source table's name selects, created on first sight (the first rule that matches wins; none: "
             "dead letter 'unrouted')"]
    for i, rule in enumerate(s.route):
        name = rule.table + (f" ({rule.replace_symbol!r}: the source table's name)" if rule.replace_symbol else "")
        key = ", ".join(rule.primary_key or ["(from the message keys)"])
        if rule.origin_columns:
            key += ", source_db, source_table"
        extra = "".join(f", {k}=[{v}]" for k, v in (("partitionBy", ", ".join(rule.partition_by)),
                                                   ("properties", ", ".join(f"{k}={v}" for k, v in
                                                                            rule.properties.items())),
                                                   ("columns", ", ".join(rule.columns or ()))) if v)
        lines.append(f":- route[{i}]: sourceTable=[{rule.source_table}] -> Sink(table=[{name}], "
                     f"path=[{rule.path or config.storage.root.rstrip('/') + '/<table>'}], primaryKey=[{key}]"
                     f"{extra}) needs [+I,+U,-D] (upsert by key, newest _seq wins, tombstones kept "
                     f"{rule.tombstone_retention})")
    lines.append(f"+- KafkaSource({what}, startingOffsets=[{_starting(s.starting_offsets)}]) changelogMode=[+I] "
                 "(raw records; topics that start matching are read from their start)")
    lines.append("")
    return lines


def _starting(starting: Any) -> str:
    """A source's starting_offsets as explain shows it (a timestamp in ISO form)."""
    moment = getattr(starting, "timestamp", None)
    return f"timestamp {moment.isoformat()}" if moment is not None else str(starting)
