"""The driver's side of source epochs (``changelake.formats.sequence``): what the read tasks found, and the
decoding done on the driver (sources whose columns are learnt at run time, routed sources), recorded in the
checkpoint before the batch's Delta commits, logged and counted.

    per batch                                 where
    ------------------------------------------------------------------------------------------------
    a read task's epoch states and changes    the decode stage's ``epochs`` / ``epochchg`` payloads (per route)
    the driver's own decoding                 :meth:`EpochBook.resequence` (start: the checkpoint's states)
    recorded                                  ``<checkpoint>/sequence_epochs/<batch id>.json``, before the commits
    each epoch change                         a WARNING naming the partition, offset and why, and
                                              ``changelake_source_epoch_changes_total{source, reason}``
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from changelake import metrics
from changelake.formats.base import DecodeResult
from changelake.formats.sequence import (
    EpochChange, PartitionEpoch, Sequencer, changes_of, merge_states, resequenced, states_of, with_ordinals)
from changelake.spark.checkpoint import epochs_at, write_epochs

log = logging.getLogger(__name__)


class EpochBook:
    """One batch's epoch states and changes, per source, on the driver."""

    def __init__(self, checkpoint: str | None) -> None:
        self.checkpoint = checkpoint
        self.states: list[dict[tuple[str, int], PartitionEpoch]] = []
        self.changes: list[tuple[str, EpochChange]] = []
        self.walked: dict = {}

    def take(self, source: str, parts: dict[str, pa.Table]) -> None:
        """Pop the read tasks' ``epochs`` and ``epochchg`` payloads of one route."""
        if "epochs" in parts:
            self.states.append(states_of(parts.pop("epochs")))
        if "epochchg" in parts:
            self.changes.extend((source, c) for c in changes_of(parts.pop("epochchg")))

    def sequencer(self, records: Sequence[pa.Table]) -> Sequencer:
        """A sequencer starting from the recorded states at the first offset of each partition of ``records``."""
        first: dict[tuple[str, int], int] = {}
        for table in records:
            for t, p, o in zip(table["topic"].to_pylist(), table["partition"].to_pylist(), table["offset"].to_pylist()):
                if o < first.get((t, p), o + 1):
                    first[(t, p)] = o
        found = epochs_at(self.checkpoint, first) if self.checkpoint else {}
        return Sequencer({k: PartitionEpoch.from_json(v) for k, v in found.items()})

    def resequence(self, source: str, sequence_by: Any, result: DecodeResult, raw: pa.Table
                   ) -> tuple[pa.Table, pa.Table]:
        """Rows and truncates of a batch decoded on the driver, sequenced as the read tasks would."""
        sequencer = self.sequencer([raw])
        rows, truncates = resequenced(sequencer, result.rows, result.truncates, result.positions, sequence_by)
        self._keep(source, sequencer)
        return rows, truncates

    def walk(self, source: str, raw: pa.Table, positions: Sequence[pa.Table]) -> Sequencer:
        """The sequencer of a routed source after all its tables' messages (walked once, in Kafka order)."""
        sequencer = self.sequencer([raw])
        self.walked = sequencer.walk(pa.concat_tables(positions)) if positions else {}
        self._keep(source, sequencer)
        return sequencer

    def ordered(self, table: pa.Table, *, truncates: bool = False) -> pa.Table:
        """A routed table's rows (or truncates) with the ordinals of the last :meth:`walk`."""
        if truncates:
            return with_ordinals(table, self.walked, topic="topic", partition="partition", offset="offset")
        return with_ordinals(table, self.walked)

    def _keep(self, source: str, sequencer: Sequencer) -> None:
        self.states.append(sequencer.end_states())
        self.changes.extend((source, c) for c in sequencer.changes)

    def settle(self, batch_id: int) -> dict[str, int]:
        """Record the states after ``batch_id``, log and count the changes; returns changes per source."""
        states = merge_states(self.states)
        if states and self.checkpoint:
            write_epochs(self.checkpoint, batch_id, {k: s.to_json() for k, s in states.items()})
        counted: dict[str, int] = {}
        for source, change in self.changes:
            log.warning("source %s: new epoch of log positions at %s", source, change.describe())
            metrics.SOURCE_EPOCHS.labels(source=source, reason=change.reason).inc()
            counted[source] = counted.get(source, 0) + 1
        self.states, self.changes = [], []
        return counted
