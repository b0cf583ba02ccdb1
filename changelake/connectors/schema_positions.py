"""Which of a batch's source schemas a table follows: the one of the newest source position, never the
one read last.

A table's source may bring several schemas in one batch, and schemas older than the one the table took:
a partition behind the others still holds changes made before an ALTER, a re-delivered message carries the
schema of its day. Each schema of a batch has a position: the newest ``_seq`` among the batch's changes
read with it. It is compared with the newest position the table has applied (the pipeline keeps it as
batches commit; after a restart: the newest of the table property ``changelake.schemaPosition``, which the
sink sets when it creates the table and before it changes its columns, and the ``_seq`` of the table's rows
and tombstones; ``changelake.service.quarantine``). A schema of the batch then is:

=========================================  ============  =====================================================
its position against the recorded one       schema is     what the table takes from it (:func:`follow`)
=========================================  ============  =====================================================
none known yet, or newer or equal           newer         every change (add, widen, narrow, drop, other type
                                                          change), in position order, as the table's
                                                          ``schema_change`` behaviour says
older                                       older         nothing: its changes are written as they are;
                                                          under ``lenient`` only what loses nothing (below)
cannot be ordered (below)                   unordered     only what loses nothing: added columns, widened
                                                          types (as the behaviour says)
=========================================  ============  =====================================================

A change read with an older schema is decoded with its own schema and written to the table's columns: a
narrower value fits the wider column, a column the table no longer has is not written, and a column its
schema lacks is written NULL in the row it changes, as for any change without a value for a column
(docs/sink.md, "Schema"). Such a schema never narrows, drops or quarantines anything. Under ``lenient``,
which loses nothing, it still adds its columns and widens types: a column the source widened and then
dropped keeps its widest type (the values read with it must fit), and a column added and dropped between
positions the table already applied is added, as in position order; a lenient table so holds every column
read in the widest type read, whatever the order of reading. "Equal" counts as
newer so that a batch replayed after a crash between the property's commit and the schema change makes
the change (the same message has the same position; two messages never share one).

Positions are compared as the ``_seq`` text, as the sink's MERGE guard compares them. A position made from
a Kafka partition and offset (formats without a log position: ``k<partition><offset>``) orders only
against positions of the same partition; against another partition's, or against a log position, it is
unordered. So without log positions a narrowing or a drop is taken once the partition that holds the
table's recorded position brings it, and a late message of another partition only ever adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import OFFSET, PARTITION, SEQ, TOPIC
from changelake.connectors.delta_sink_kernel import kafka_partition_prefix
from changelake.connectors.delta_sink_schema import PROP_SCHEMA_POSITION, ColumnChange, column_changes

__all__ = ["PROP_SCHEMA_POSITION", "Followed", "SourceSchema", "follow", "position_order", "schema_positions"]

Order = Literal["newer", "older", "unordered"]


def position_order(position: str, recorded: str) -> Order:
    """How a schema at ``position`` stands against the table's ``recorded`` schema position (module doc)."""
    mine, theirs = kafka_partition_prefix(position), kafka_partition_prefix(recorded)
    if (mine is None) != (theirs is None) or mine != theirs:
        return "unordered"
    return "newer" if position >= recorded else "older"


@dataclass(frozen=True)
class SourceSchema:
    """A source schema of a batch (user columns) and the newest ``_seq`` of the batch's changes read with it
    (None: no position, as schema-less sources; only its additions and widenings count); ``first``: the
    oldest such ``_seq`` (None: the same as ``position``), which says the schema a new table starts from."""

    columns: pa.Schema
    position: str | None
    first: str | None = None

    @property
    def earliest(self) -> str | None:
        return self.first if self.first is not None else self.position


@dataclass(frozen=True)
class Followed:
    """What a table takes from a batch's schemas.

    ``target``: the user columns the batch is written with (the table's, with what it takes);
    ``changes``: each difference found, once per kind and column; ``dropped``: table columns it drops;
    ``position``: the newest position of the newer schemas, to record when the table changes;
    ``older``: how many of the batch's schemas were older than the table's."""

    target: pa.Schema
    changes: tuple[ColumnChange, ...]
    dropped: tuple[str, ...]
    position: str | None
    older: int = 0

    @property
    def refused(self) -> tuple[ColumnChange, ...]:
        return tuple(c for c in self.changes if c.outcome == "refuse")


def follow(table: pa.Schema, schemas: Sequence[SourceSchema], *, recorded: str | None, behaviour: str,
           primary_key: Sequence[str] = (), partition_by: Sequence[str] = (), drops: bool = True) -> Followed:
    """Walk the batch's ``schemas`` against the table's user columns ``table`` whose schema position is
    ``recorded`` (module doc). ``drops``: whether a column a schema lacks was dropped (False for schemas
    read from schema-less data, where an absent field says nothing)."""
    placed = [s for s in schemas if s.position is not None]
    anchor = recorded if recorded is not None else max((s.position for s in placed), default=None)
    chain: list[SourceSchema] = []
    loose = [s for s in schemas if s.position is None]
    older = 0
    for s in placed:
        order = position_order(s.position, anchor)
        if order == "unordered":
            loose.append(s)
        elif order == "newer" or recorded is None:
            chain.append(s)
        else:
            older += 1
            if behaviour == "lenient":      # lenient loses nothing: an older schema still adds and widens
                loose.append(s)
    chain.sort(key=lambda s: s.position)
    virtual = table
    found: dict[tuple[str, str], ColumnChange] = {}
    for s in chain:
        gone = [n for n in virtual.names if n not in s.columns.names] if drops else []
        changes = column_changes(virtual, list(s.columns), behaviour=behaviour, dropped=gone,
                                 primary_key=primary_key, partition_by=partition_by)
        virtual = _taken(virtual, changes, found)
    for s in loose:
        changes = [c for c in column_changes(virtual, list(s.columns), behaviour=behaviour)
                   if c.kind in ("add_column", "widen_type")]
        virtual = _taken(virtual, changes, found)
    return Followed(target=virtual, changes=tuple(found.values()),
                    dropped=tuple(n for n in table.names if n not in virtual.names),
                    position=chain[-1].position if chain else None, older=older)


def _taken(columns: pa.Schema, changes: Sequence[ColumnChange], found: dict) -> pa.Schema:
    """``columns`` after the changes whose outcome is apply; every change noted in ``found``."""
    for c in changes:
        found.setdefault((c.kind, c.column), c)
        if c.outcome != "apply":
            continue
        if c.kind == "add_column":
            columns = columns.append(pa.field(c.column, c.new, nullable=True))
        elif c.kind == "widen_type":
            i = columns.get_field_index(c.column)
            columns = columns.set(i, columns.field(i).with_type(c.new))
        elif c.kind.startswith("drop"):
            columns = columns.remove(columns.get_field_index(c.column))
    return columns


def schema_positions(raw: pa.Table, record_schemas: pa.Array, rows: pa.Table, n: int
                     ) -> list[tuple[str, str] | None]:
    """Per schema index ``0..n-1``: the oldest and the newest ``_seq`` of ``rows`` decoded from the ``raw`` records
    read with it (``record_schemas``: each raw record's schema index, null when it has none); None when no row
    has it."""
    out: list[tuple[str, str] | None] = [None] * n
    if rows.num_rows == 0 or n == 0:
        return out
    by_record = pa.table({"t": raw["topic"], "p": raw["partition"].cast(pa.int32()), "o": raw["offset"],
                          "s": record_schemas})
    by_record = by_record.filter(pc.is_valid(by_record["s"]))
    changes = pa.table({"t": rows[TOPIC], "p": rows[PARTITION].cast(pa.int32()), "o": rows[OFFSET], "q": rows[SEQ]})
    joined = changes.join(by_record, keys=["t", "p", "o"], join_type="inner")
    spans = joined.group_by("s").aggregate([("q", "min"), ("q", "max")])
    for s, first, last in zip(spans["s"].to_pylist(), spans["q_min"].to_pylist(), spans["q_max"].to_pylist()):
        out[s] = (first, last)
    return out
