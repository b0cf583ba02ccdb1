"""Rebuilding changed views from the lake: ``changelake run --rebuild-views``.

On an existing checkpoint whose views changed (``service.lifecycle``), instead of re-reading the topics,
the run starts the next checkpoint generation from the lake::

    step                                               where
    1  the old checkpoint's last committed batch b,    <checkpoint>/commits, offsets/<b>
       its Kafka end offsets
    2  per source the graph reads: its mirrored        the newest Delta version whose transaction version
       table as batch b left it                        (changelake:<pipeline id>:<table>) is at most (g, b)
    3  refuse when a source is not mirrored, or into   "re-read the topics with a new checkpoint (and
       a history table (history: scd2), or its table   mirror the source in that change)"
       lacks a column the views read
    4  record the plan in the old checkpoint, move     <checkpoint>/changelake/rebuild.json, then
       it to <checkpoint>.gen<g>                       <checkpoint> -> <checkpoint>.gen<g>
    5  the new checkpoint (generation g + 1) records   lineage.json "rebuild"; the epoch states of the
       the plan, starts every source at those offsets  old checkpoint carried (sequence_epochs/start.json)
    6  its first batch: the tables' rows at those      the chain only (spark.kafka_source.SnapshotTask):
       versions as +I changes with their _seq, and     the mirrors already hold them, and they take the
       the records after the offsets                   new records by _seq as always; each view's table
                                                       is replaced by its first commit (generation g + 1)

So the views see each change once: the snapshot holds every change up to batch b, the stream every one
after it. A crash before step 5 finished is resumed at the next start from the record of step 4 (the old
checkpoint is found at <checkpoint>.gen<g>); a crash in the first batch replays it with the same snapshot
(the recorded versions) and offsets, and writes nothing twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from changelake.changelog import commit_position
from changelake.connectors.commits import RESTART_DOC
from changelake.connectors.delta_read import table_columns, version_at_position
from changelake.errors import ChangelakeError
from changelake.plan.physical import PhysicalPlan
from changelake.service.config import ChangelakeConfig
from changelake.spark.checkpoint import batch_end_offsets, carry_epochs, filesystem, last_committed_batch

log = logging.getLogger(__name__)

#: in the old checkpoint: the rebuild it is being moved away for (step 4)
PLAN = "changelake/rebuild.json"


class RebuildRefused(ChangelakeError):
    """The views cannot be rebuilt from the lake; the message says what to do."""


@dataclass(frozen=True)
class Rebuild:
    """Where a rebuilt checkpoint starts: the old checkpoint's generation and last batch, its Kafka end
    offsets, and per mirrored source the Delta version of its table at that batch."""

    generation: int
    batch: int
    offsets: dict[str, dict[str, int]]
    tables: dict[str, int]          # source name -> version of its mirrored table
    kept: str                       # where the old checkpoint was moved

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "batch": self.batch, "offsets": self.offsets,
                "tables": self.tables, "kept": self.kept}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Rebuild":
        return cls(generation=int(data["generation"]), batch=int(data["batch"]),
                   offsets={t: {p: int(o) for p, o in ps.items()} for t, ps in data["offsets"].items()},
                   tables={s: int(v) for s, v in data["tables"].items()}, kept=str(data["kept"]))


def plan_rebuild(config: ChangelakeConfig, plan: PhysicalPlan, generation: int) -> Rebuild:
    """Steps 1-3 of the module docstring for the checkpoint of generation ``generation``."""
    checkpoint = config.pipeline.checkpoint
    sources = {s.name: s for s in config.sources}
    unmirrored = sorted(n.source for n in plan.sources if sources[n.source].table is None)
    if unmirrored:
        raise RebuildRefused(
            f"--rebuild-views builds the views from the sources' mirrored tables, but source(s) "
            f"{', '.join(unmirrored)} are not mirrored into a table. Re-read the topics instead: move the "
            f"checkpoint {checkpoint} away and run without --rebuild-views; the new checkpoint re-reads every "
            "source from starting_offsets: earliest. To rebuild from the lake next time, mirror the source(s) "
            "into a table (sources[].table: <name>) in that same change, so the re-read fills the table "
            f"({RESTART_DOC})")
    histories = sorted(n.source for n in plan.sources if config.table(sources[n.source].table).history is not None)
    if histories:
        raise RebuildRefused(
            f"source(s) {', '.join(histories)} are mirrored into history tables (history: scd2), which keep every "
            "version of a key, not the source's state: the views cannot be rebuilt from them. Move the checkpoint "
            f"{checkpoint} away and run without --rebuild-views; the new checkpoint re-reads every source from "
            f"starting_offsets: earliest ({RESTART_DOC})")
    last = last_committed_batch(checkpoint)
    offsets = batch_end_offsets(checkpoint, last[0]) if last is not None else {}
    if last is None or not offsets:
        raise RebuildRefused(
            f"checkpoint {checkpoint} has committed no batch (or its offset log cannot be read), so there is no "
            "position to rebuild the views from: move it away and run without --rebuild-views (a new checkpoint "
            f"re-reads the sources) ({RESTART_DOC})")
    position = commit_position(last[0], generation)
    options = config.storage.plain_options() or None
    tables: dict[str, int] = {}
    for name in sorted({n.source for n in plan.sources}):
        table = sources[name].table
        version = version_at_position(config.table_path(table), f"changelake:{config.pipeline.id}:{table}",
                                      position, storage_options=options)
        if version is None:
            raise RebuildRefused(
                f"source {name} is mirrored into table {table}, but the table has no version at batch {last[0]} "
                f"of checkpoint generation {generation} (missing, or its log was cleaned up): move the checkpoint "
                f"away and run without --rebuild-views to re-read the topics ({RESTART_DOC})")
        node = next(n for n in plan.sources if n.source == name)
        held = table_columns(config.table_path(table), version, storage_options=options)
        lacking = [f.name for f in node.schema if f.name not in held]
        if lacking:
            raise RebuildRefused(
                f"source {name}'s view input needs column(s) {', '.join(lacking)}, which its table {table} did not "
                f"hold at batch {last[0]}: the views cannot be rebuilt from it. Move the checkpoint away and run "
                f"without --rebuild-views to re-read the topics ({RESTART_DOC})")
        tables[name] = version
    return Rebuild(generation=generation, batch=last[0], offsets=offsets, tables=tables,
                   kept=f"{checkpoint.rstrip('/')}.gen{generation}")


def move_checkpoint(config: ChangelakeConfig, rebuild: Rebuild) -> None:
    """Step 4: record the rebuild in the old checkpoint, then move it to ``rebuild.kept``."""
    checkpoint = config.pipeline.checkpoint
    fs, root = filesystem(checkpoint)
    refuse_kept_taken(rebuild)
    _, kept = filesystem(rebuild.kept)
    with fs.open_output_stream(f"{root}/{PLAN}") as f:
        f.write(json.dumps(rebuild.to_json(), indent=1).encode())
    fs.move(root, kept)
    log.warning("views changed: rebuilding them from the mirrored tables (%s) at batch %d of checkpoint "
                "generation %d; the old checkpoint is kept at %s", ", ".join(
                    f"{s} at version {v}" for s, v in sorted(rebuild.tables.items())), rebuild.batch,
                rebuild.generation, rebuild.kept)


def refuse_kept_taken(rebuild: Rebuild) -> None:
    """Step 4 cannot keep the old checkpoint where something already is."""
    from pyarrow import fs as pafs

    kept_fs, kept = filesystem(rebuild.kept)
    if kept_fs.get_file_info(kept).type != pafs.FileType.NotFound:
        raise RebuildRefused(f"cannot keep the old checkpoint at {rebuild.kept}: it exists. Move it away, then run "
                             f"again ({RESTART_DOC})")


def start_new(config: ChangelakeConfig, rebuild: Rebuild) -> None:
    """Step 5's files besides the lineage: the old checkpoint's epoch states."""
    carry_epochs(rebuild.kept, config.pipeline.checkpoint, rebuild.batch)


def interrupted(config: ChangelakeConfig, generation: int) -> Rebuild | None:
    """A rebuild whose old checkpoint (generation ``generation``) was moved away before the new one was
    recorded (a crash between steps 4 and 5), or None."""
    kept = f"{config.pipeline.checkpoint.rstrip('/')}.gen{generation}"
    fs, root = filesystem(kept)
    try:
        with fs.open_input_stream(f"{root}/{PLAN}") as f:
            return Rebuild.from_json(json.loads(f.read().decode()))
    except (OSError, FileNotFoundError, ValueError, KeyError):
        return None


def reader_options(rebuild: Rebuild) -> dict[str, str]:
    """The Kafka source's options of a rebuilt checkpoint: every source starts at the old one's offsets."""
    return {"startingOffsets": json.dumps(rebuild.offsets)}
