"""Whether a batch's write to a table is new, a replay of a committed batch, or refused.

Every write of a pipeline (a Delta table's MERGE, the dead-letter table's append, the dead-letter topic's
ledger) records its batch's commit position (:func:`changelake.changelog.commit_position`: the
checkpoint's generation, then the batch id) as the Delta transaction version of app id
``changelake:<pipeline id>:<name>``. A new checkpoint restarts its batch ids at 0 with a higher
generation, so its writes come after every older checkpoint's. The rule, for the position recorded
in the table, (g, b), and the batch being written, (G, B)::

    nothing recorded, or g < G    write   (a new checkpoint's batch after an older checkpoint's)
    g == G, b < B                 write
    g == G, b == B                replay  (a restart after a crash replays the batch: write nothing again)
    g == G, b > B                 refuse  (the checkpoint is behind the table it wrote)
    g > G                         refuse  (a newer checkpoint wrote the table: this one is stale)

A refusal raises :class:`~changelake.errors.SinkCommitError` saying what to do, never a silent skip.
"""

from __future__ import annotations

from typing import Literal

from changelake.changelog import commit_position, split_commit_position
from changelake.errors import SinkCommitError

__all__ = ["RESTART_DOC", "check_position", "describe"]

#: Where the user reads what to do when a restart is refused.
RESTART_DOC = 'docs/operations.md, "Changing a running pipeline"'


def describe(position: int) -> str:
    """``batch 7 of checkpoint generation 2`` for a recorded position."""
    generation, batch = split_commit_position(position)
    return f"batch {batch} of checkpoint generation {generation}"


def check_position(recorded: int | None, *, generation: int, batch_id: int, what: str) -> Literal["write", "replay"]:
    """The rule of the module docstring for ``what`` (e.g. ``table orders``), whose recorded position is
    ``recorded`` (None: nothing recorded), and the batch ``batch_id`` of checkpoint generation ``generation``."""
    position = commit_position(batch_id, generation)
    if recorded is None or recorded < position:        # g < G, or g == G and b < B
        return "write"
    if recorded == position:
        return "replay"
    g, b = split_commit_position(recorded)
    if g > generation:
        raise SinkCommitError(
            f"{what} was written by a newer checkpoint ({describe(recorded)}) than the one running (batch "
            f"{batch_id} of generation {generation}): this checkpoint would write older changes over newer ones. "
            f"Run the pipeline with the checkpoint that wrote it, or start a new checkpoint ({RESTART_DOC})")
    raise SinkCommitError(
        f"{what} already holds {describe(recorded)}, but the running checkpoint (the same generation) is at batch "
        f"{batch_id}: the checkpoint is older than the table it wrote (restored from a backup, or copied?). "
        f"Nothing was written. Move the checkpoint (pipeline.checkpoint) away and run again: a new checkpoint "
        f"gets a new generation and re-reads the sources ({RESTART_DOC})")
