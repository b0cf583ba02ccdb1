"""Which row kinds an operator produces and which it needs (Flink's ModifyKindSet / UpdateKind).

A planner walks the pipeline from the sink back to the sources: each operator
states what it emits for a given configuration (:class:`ChangelogMode`) and
whether it needs ``-U`` from its input (:class:`UpdateKind`). An upsert sink
keyed by its input's upsert key needs only ``+U``; a sink keyed differently needs
``-U`` and the :class:`~changelake.operators.sink_upsert_materializer.SinkUpsertMaterializer`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from changelake.changelog import RowKind


class ModifyKind(enum.Enum):
    INSERT = "I"
    UPDATE = "U"
    DELETE = "D"


class UpdateKind(enum.Enum):
    """How updates travel: ``NONE`` (no updates), ``ONLY_UPDATE_AFTER`` (upsert), ``BEFORE_AND_AFTER`` (retract)."""

    NONE = "none"
    ONLY_UPDATE_AFTER = "only_update_after"
    BEFORE_AND_AFTER = "before_and_after"


@dataclass(frozen=True)
class ChangelogMode:
    """The set of row kinds a stream may carry."""

    kinds: frozenset[RowKind]

    @classmethod
    def of(cls, *kinds: RowKind) -> "ChangelogMode":
        return cls(frozenset(kinds))

    @property
    def modify_kinds(self) -> frozenset[ModifyKind]:
        out = set()
        if RowKind.INSERT in self.kinds:
            out.add(ModifyKind.INSERT)
        if RowKind.UPDATE_AFTER in self.kinds or RowKind.UPDATE_BEFORE in self.kinds:
            out.add(ModifyKind.UPDATE)
        if RowKind.DELETE in self.kinds:
            out.add(ModifyKind.DELETE)
        return frozenset(out)

    @property
    def update_kind(self) -> UpdateKind:
        if RowKind.UPDATE_BEFORE in self.kinds:
            return UpdateKind.BEFORE_AND_AFTER
        if RowKind.UPDATE_AFTER in self.kinds:
            return UpdateKind.ONLY_UPDATE_AFTER
        return UpdateKind.NONE

    @property
    def is_insert_only(self) -> bool:
        return self.kinds <= {RowKind.INSERT}

    def __str__(self) -> str:
        return "[" + ",".join(k.short for k in sorted(self.kinds)) + "]"


INSERT_ONLY = ChangelogMode.of(RowKind.INSERT)
UPSERT = ChangelogMode.of(RowKind.INSERT, RowKind.UPDATE_AFTER, RowKind.DELETE)
ALL = ChangelogMode.of(RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE)


def updates(*, generate_update_before: bool, generate_insert: bool = True, deletes: bool = False) -> ChangelogMode:
    """The mode of an operator that updates its results (with or without ``-U``)."""
    kinds = {RowKind.UPDATE_AFTER}
    if generate_insert:
        kinds.add(RowKind.INSERT)
    if generate_update_before:
        kinds.add(RowKind.UPDATE_BEFORE)
    if deletes:
        kinds.add(RowKind.DELETE)
    return ChangelogMode(frozenset(kinds))


@dataclass(frozen=True)
class ChangelogContract:
    """What an operator emits for its configuration and what it needs from each input."""

    produces: ChangelogMode
    accepts: ChangelogMode
    needs_update_before: bool
