"""What the Delta sink stores, and how a batch's schema is reconciled with a table's.

Stored columns of a sink table: the user columns of the changelog, then ``_seq``
(the ordering token that guards every MERGE), then ``_source_ts`` when the
batch carries it. The other reserved columns (``_kind``, ``_topic``,
``_partition``, ``_offset``, ``_db``, ``_table``) describe a change, not a row,
and are not stored.

Schema changes (:func:`schema_plan`, the one home of the rule). The source's columns
(a new writer schema, a new Connect schema in a JSON envelope, a new field of
schema-less JSON) are compared with the table's user columns; which of a batch's schemas
count, and in what order, is the source position's rule (:mod:`changelake.connectors.schema_positions`:
an older schema than the table's changes nothing, or under lenient only adds and widens); what happens
to each difference is the table's ``schema_change`` behaviour (Flink CDC's ``schema.change.behavior``):

===========================  ========  ==========  ========  ========  =========
change of the source          evolve    try_evolve  lenient   ignore    exception
===========================  ========  ==========  ========  ========  =========
column added                 add       add         add       not kept  refuse
type widened (int -> long)   widen     widen       widen     convert   refuse
type narrowed (long -> int)  refuse    keep        keep      keep      refuse
column dropped               drop      drop        keep      keep      refuse
key column dropped           refuse    refuse      refuse    refuse    refuse
partition column dropped     refuse    keep        keep      keep      refuse
other type change            refuse    convert     refuse    convert   refuse
===========================  ========  ==========  ========  ========  =========

* add: a nullable column is added; rows written before read NULL. not kept: the
  table does not get it and its values are not written.
* widen: the column takes the wider type (the table's files are rewritten with it,
  one commit). keep: the table's type stays and holds every new value.
* convert: the table's type stays; each value is converted to it, and a message with a
  value it cannot hold (2^40 into an int, 'abc' into a long) is a dead letter
  (``schema-mismatch``), never written wrong.
* drop: the column leaves the table (its files are rewritten without it, one commit).
  keep: the column stays and changes from then on write NULL into it.
* refuse: the table is quarantined: from this batch on its messages go to the
  dead-letter path (reason ``schema-incompatible``) until a restart with a fix;
  ``changelake dlq replay`` then brings them back. The other tables go on.
* A rename is a drop plus an add. A longer VARCHAR is the same Delta type (string):
  no change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from changelake.changelog import SEQ, SOURCE_TS, user_columns
from changelake.errors import SinkCommitError
from changelake.types import type_change

#: Table properties the sink records; part of the on-disk contract.
PROP_PRIMARY_KEY = "changelake.primaryKey"
PROP_SEQUENCE_COLUMN = "changelake.sequenceColumn"
PROP_TOMBSTONES = "changelake.tombstoneTable"
PROP_TOMBSTONES_OF = "changelake.tombstonesOf"
#: the position of the latest truncate applied to the table: it holds no change from before it
PROP_TRUNCATED_BEFORE = "changelake.truncatedBefore"
#: "scd2" on a history table (``TableSpec.history``), absent on an upsert table
PROP_HISTORY = "changelake.history"
#: JSON list of a history table's tracked columns; absent when every column is tracked
PROP_TRACK_HISTORY = "changelake.trackHistory"
#: the source position (``_seq``) of the schema the table last changed for (``schema_positions``)
PROP_SCHEMA_POSITION = "changelake.schemaPosition"

#: Delta properties of the tables the sink creates, where the table's ``properties`` name no other value: a
#: checkpoint every 10 commits (Delta Spark's default; delta-rs's is 100). Each reader of the log loads the
#: newest checkpoint and then every commit after it, one GET each on an object store: a restart's start check
#: and the first batch of every table read up to 100 commits each before (docs/sink.md, "Exactly-once").
CREATED_DEFAULTS = {"delta.checkpointInterval": "10"}

#: Column of the tombstone table holding when the delete was committed.
DELETED_AT = "_deleted_at"
DELETED_AT_TYPE = pa.timestamp("us", tz="UTC")

#: Directory, next to the sink table, that holds the tombstone tables.
TOMBSTONE_DIR = "_changelake_tombstones"



def stored_fields(batch_schema: pa.Schema) -> list[pa.Field]:
    """The fields of a changelog batch that the sink writes to the table, in table order."""
    names = user_columns(batch_schema.empty_table())
    names.append(SEQ)
    if SOURCE_TS in batch_schema.names:
        names.append(SOURCE_TS)
    return [batch_schema.field(n) for n in names]


def default_tombstone_path(table_path: str) -> str:
    """``<parent of the table>/_changelake_tombstones/<table directory name>``.

    The table's directory name is unique within its parent, so two sink tables
    never share a tombstone table.
    """
    trimmed = table_path.rstrip("/")
    parent, sep, leaf = trimmed.rpartition("/")
    if not sep or not leaf or parent.endswith((":/", ":")):
        raise SinkCommitError(
            f"cannot place the tombstone table next to {table_path!r}: it has no parent directory; "
            "set TableSpec.tombstone_path explicitly")
    return f"{parent}/{TOMBSTONE_DIR}/{leaf}"


def table_properties(primary_key: Sequence[str], tombstone_path: str) -> dict[str, str]:
    """Properties written when the sink creates a table."""
    return {
        PROP_PRIMARY_KEY: json.dumps(list(primary_key)),
        PROP_SEQUENCE_COLUMN: SEQ,
        PROP_TOMBSTONES: tombstone_path,
    }


def tombstone_properties(primary_key: Sequence[str], table_path: str) -> dict[str, str]:
    """Properties of a tombstone table: its key and the sink table it belongs to (and :data:`CREATED_DEFAULTS`)."""
    return {**CREATED_DEFAULTS, PROP_PRIMARY_KEY: json.dumps(list(primary_key)), PROP_TOMBSTONES_OF: table_path}


def check_table_contract(*, path: str, properties: Mapping[str, str], partition_columns: Sequence[str],
                         schema: pa.Schema, primary_key: Sequence[str], partition_by: Sequence[str],
                         history: str | None = None) -> None:
    """Refuse to write into an existing table that another key, layout or history mode was declared for."""
    recorded = properties.get(PROP_PRIMARY_KEY)
    if recorded is None:
        raise SinkCommitError(
            f"table {path} has no {PROP_PRIMARY_KEY} property, so it was not created by changelake; "
            "point the sink at a new path, or set the property to a JSON list of the key columns "
            "and add a string column _seq")
    if json.loads(recorded) != list(primary_key):
        raise SinkCommitError(
            f"table {path} was created with primary key {json.loads(recorded)} but the pipeline declares "
            f"{list(primary_key)}; fix primary_key in the pipeline config or write to a new table")
    if list(partition_columns) != list(partition_by):
        raise SinkCommitError(
            f"table {path} is partitioned by {list(partition_columns)} but the pipeline declares "
            f"partition_by {list(partition_by)}; fix partition_by or write to a new table")
    if properties.get(PROP_HISTORY) != history:
        raise SinkCommitError(
            f"table {path} is {'a history table (history: ' + properties[PROP_HISTORY] + ')' if properties.get(PROP_HISTORY) else 'an upsert table'}"
            f" but the pipeline declares {'history: ' + history if history else 'an upsert table (no history)'}; "
            "fix the table's history setting or write to a new table")
    if SEQ not in schema.names:
        raise SinkCommitError(f"table {path} lacks the {SEQ} column the sink orders changes by; "
                              "write to a new table")


def check_tombstone_contract(*, path: str, properties: Mapping[str, str], table_path: str) -> None:
    """Refuse a tombstone table that belongs to another sink table."""
    owner = properties.get(PROP_TOMBSTONES_OF)
    if owner != table_path:
        raise SinkCommitError(
            f"tombstone table {path} belongs to {owner or 'no changelake table'}, not to {table_path}; "
            "give every sink table its own tombstone_path")


#: what a table does with a change of its source's columns (see the module doc)
Behaviour = Literal["evolve", "try_evolve", "lenient", "ignore", "exception"]
BEHAVIOURS: tuple[str, ...] = ("evolve", "try_evolve", "lenient", "ignore", "exception")

_OUTCOME: dict[str, dict[str, str]] = {     # change kind -> behaviour -> outcome (the module doc's table)
    "add_column": dict(evolve="apply", try_evolve="apply", lenient="apply", ignore="skip", exception="refuse"),
    "widen_type": dict(evolve="apply", try_evolve="apply", lenient="apply", ignore="convert", exception="refuse"),
    "narrow_type": dict(evolve="refuse", try_evolve="keep", lenient="keep", ignore="keep", exception="refuse"),
    "drop_column": dict(evolve="apply", try_evolve="apply", lenient="keep", ignore="keep", exception="refuse"),
    "drop_key_column": dict(evolve="refuse", try_evolve="refuse", lenient="refuse", ignore="refuse",
                            exception="refuse"),
    "drop_partition_column": dict(evolve="refuse", try_evolve="keep", lenient="keep", ignore="keep",
                                  exception="refuse"),
    "change_type": dict(evolve="refuse", try_evolve="convert", lenient="refuse", ignore="convert",
                        exception="refuse"),
}


@dataclass(frozen=True)
class ColumnChange:
    """One difference between the source's columns and the table's; ``outcome`` per the behaviour:
    apply, keep (the table stays as it is and holds the values), skip (the values are not written),
    convert (values converted to the table's type) or refuse (the table is quarantined)."""

    kind: str
    column: str
    old: pa.DataType | None
    new: pa.DataType | None
    outcome: str

    def describe(self) -> str:
        if self.kind == "add_column":
            return f"column {self.column!r} was added ({self.new})"
        if self.kind.startswith("drop"):
            return f"column {self.column!r} was removed"
        return f"column {self.column!r} changed from {self.old} to {self.new}"


@dataclass(frozen=True)
class SchemaPlan:
    """How to write a batch into a table: columns to add, to widen and to drop first, then the Arrow
    schema to cast to; ``changes``: every difference found; ``skip``: batch columns not written."""

    new_fields: tuple[pa.Field, ...]
    target_schema: pa.Schema
    widened: tuple[pa.Field, ...] = ()
    dropped: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    changes: tuple[ColumnChange, ...] = ()

    @property
    def refused(self) -> tuple[ColumnChange, ...]:
        return tuple(c for c in self.changes if c.outcome == "refuse")

    @property
    def rewrites(self) -> bool:
        """Whether the table's files are rewritten (a widened or dropped column)."""
        return bool(self.widened or self.dropped)


def column_changes(table_schema: pa.Schema, source_fields: Sequence[pa.Field], *, behaviour: str,
                   dropped: Sequence[str] = (), primary_key: Sequence[str] = (),
                   partition_by: Sequence[str] = ()) -> list[ColumnChange]:
    """The differences between the source's user columns and the table's, each with its outcome under
    ``behaviour``. ``dropped``: table columns the source no longer has (known only from a schema)."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown schema_change behaviour {behaviour!r}; expected one of {list(BEHAVIOURS)}")
    out = []
    for field in source_fields:
        if field.name not in table_schema.names:
            kind = "add_column"
        else:
            moved = type_change(table_schema.field(field.name).type, field.type)
            if moved == "same":
                continue
            kind = {"widen": "widen_type", "narrow": "narrow_type"}.get(moved, "change_type")
        old = table_schema.field(field.name).type if field.name in table_schema.names else None
        out.append(ColumnChange(kind, field.name, old, field.type, _OUTCOME[kind][behaviour]))
    for name in dropped:
        if name not in table_schema.names:     # a dropped column may still be in a batch: older rows hold it
            continue
        kind = ("drop_key_column" if name in primary_key else
                "drop_partition_column" if name in partition_by else "drop_column")
        out.append(ColumnChange(kind, name, table_schema.field(name).type, None, _OUTCOME[kind][behaviour]))
    return out


def schema_plan(*, path: str, table_schema: pa.Schema, batch_fields: Sequence[pa.Field],
                behaviour: str = "lenient", dropped: Sequence[str] = (), primary_key: Sequence[str] = (),
                partition_by: Sequence[str] = ()) -> SchemaPlan:
    """Plan the write of ``batch_fields`` into a table whose Arrow schema is ``table_schema`` under the
    ``schema_change`` ``behaviour`` (module doc). A refused change raises :class:`SinkCommitError`
    naming it: the pipeline quarantines a table before its batch gets here (:func:`column_changes`)."""
    changes = column_changes(table_schema, batch_fields, behaviour=behaviour, dropped=dropped,
                             primary_key=primary_key, partition_by=partition_by)
    refused = [c for c in changes if c.outcome == "refuse"]
    if refused:
        raise SinkCommitError(
            f"schema conflict writing to {path} (schema_change: {behaviour}): "
            + "; ".join(c.describe() for c in refused)
            + ". Cast these columns to the table's types in the pipeline, choose another schema_change "
            "behaviour (docs/pipelines.md, 'Schema changes'), or write to a new table")
    new_fields = [pa.field(c.column, c.new, nullable=True) for c in changes
                  if c.kind == "add_column" and c.outcome == "apply"]
    widened = {c.column: c.new for c in changes if c.kind == "widen_type" and c.outcome == "apply"}
    drops = tuple(c.column for c in changes if c.kind == "drop_column" and c.outcome == "apply")
    skip = tuple(c.column for c in changes if c.outcome == "skip") + drops
    target = pa.schema([f.with_type(widened.get(f.name, f.type)) for f in table_schema if f.name not in drops]
                       + new_fields)
    return SchemaPlan(new_fields=tuple(new_fields), target_schema=target,
                      widened=tuple(pa.field(n, t, nullable=True) for n, t in widened.items()),
                      dropped=drops, skip=skip, changes=tuple(changes))


def reconcile(*, path: str, table_schema: pa.Schema, batch_fields: Sequence[pa.Field]) -> SchemaPlan:
    """:func:`schema_plan` under the default behaviour (``lenient``)."""
    return schema_plan(path=path, table_schema=table_schema, batch_fields=batch_fields)


def tombstone_schema(table_schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """Key columns with the table's types, the delete's ``_seq``, and when it was committed."""
    return pa.schema([table_schema.field(k) for k in primary_key]
                     + [pa.field(SEQ, pa.string()), pa.field(DELETED_AT, DELETED_AT_TYPE)])
