"""``changelake explain``: the operator graph with each node's changelog mode."""

from __future__ import annotations

from changelake.service.config import ChangelakeConfig


def explain(config: ChangelakeConfig) -> str:
    lines = [f"pipeline {config.pipeline.id}  (checkpoint {config.pipeline.checkpoint})"]
    for table in config.tables:
        lines.append(f"Sink: delta-upsert table={table.name} path={config.table_path(table.name)} "
                     f"primary_key={table.primary_key or '(from the message keys)'}  needs [+I, +U, -D] (upsert by key, newest _seq wins, "
                     f"tombstones kept {table.tombstone_retention})")
        for s in config.sources:
            if s.table != table.name:
                continue
            what = f"topics={s.topics}" if s.topics else f"topic_pattern={s.topic_pattern!r}"
            lines.append(f"+- Decode: {s.format} source={s.name} on_error={s.on_error}  "
                         f"changelogMode=[+I, -U, +U, -D]")
            lines.append(f"   +- KafkaSource: {what} starting_offsets={s.starting_offsets}  "
                         f"changelogMode=[+I] (raw records)")
    return "\n".join(lines)
