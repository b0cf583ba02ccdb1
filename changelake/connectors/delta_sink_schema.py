"""What the Delta sink stores, and how a batch's schema is reconciled with a table's.

Stored columns of a sink table: the user columns of the changelog, then ``_seq``
(the ordering token that guards every MERGE), then ``_source_ts`` when the
batch carries it. The other reserved columns (``_kind``, ``_topic``,
``_partition``, ``_offset``, ``_db``, ``_table``) describe a change, not a row,
and are not stored.

Schema rules when a batch meets an existing table:

=====================================  ==========================================
batch column vs table column           outcome
=====================================  ==========================================
same Delta type                        written as is (cast to the table's Arrow type)
narrower integer / float (int -> long)  widened to the table's type
absent from the table                  added as a nullable column (schema evolution)
absent from the batch                  written as NULL (the row image has no value)
any other difference                   :class:`SinkCommitError` naming the column
=====================================  ==========================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from changelake.changelog import SEQ, SOURCE_TS, user_columns
from changelake.errors import SinkCommitError
from changelake.types import delta_type, fits

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
    """Properties of a tombstone table: its key and the sink table it belongs to."""
    return {PROP_PRIMARY_KEY: json.dumps(list(primary_key)), PROP_TOMBSTONES_OF: table_path}


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


@dataclass(frozen=True)
class SchemaPlan:
    """How to write a batch into a table: columns to add first, then the Arrow schema to cast to."""

    new_fields: tuple[pa.Field, ...]
    target_schema: pa.Schema


def reconcile(*, path: str, table_schema: pa.Schema, batch_fields: Sequence[pa.Field]) -> SchemaPlan:
    """Plan the write of ``batch_fields`` into a table whose Arrow schema is ``table_schema``."""
    conflicts = []
    new_fields = []
    for field in batch_fields:
        if field.name not in table_schema.names:
            new_fields.append(field.with_nullable(True))
            continue
        existing = table_schema.field(field.name)
        if not fits(field, existing):
            conflicts.append(f"column {field.name!r} is {delta_type(existing)} in the table but "
                             f"{delta_type(field)} in the batch")
    if conflicts:
        raise SinkCommitError(
            f"schema conflict writing to {path}: " + "; ".join(conflicts)
            + ". Cast these columns to the table's types in the pipeline, or write to a new table "
            "(the sink only adds nullable columns and widens integer and floating-point types)")
    target = pa.schema(list(table_schema) + new_fields)
    return SchemaPlan(new_fields=tuple(new_fields), target_schema=target)


def tombstone_schema(table_schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """Key columns with the table's types, the delete's ``_seq``, and when it was committed."""
    return pa.schema([table_schema.field(k) for k in primary_key]
                     + [pa.field(SEQ, pa.string()), pa.field(DELETED_AT, DELETED_AT_TYPE)])
