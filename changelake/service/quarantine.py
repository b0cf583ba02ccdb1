"""Schema changes of a table's source, screened per table before the table is written; tables
quarantined by a change their ``schema_change`` behaviour refuses, while the other tables go on.

For a source decoded on the driver (its columns come from the messages: a Connect schema in
the JSON envelope, Avro writer schemas, or the fields of schema-less JSON), each batch's source
schemas are compared with the table's columns in the order of their source positions, never in the
order they were read (:func:`~changelake.connectors.schema_positions.follow`: a schema older than the
one the table took changes nothing, or under lenient only adds and widens; the table of outcomes per
change is in :mod:`changelake.connectors.delta_sink_schema`):

* refuse: the table is quarantined. Every message of the batch for it, and of every later batch
  until a restart, is a dead letter with reason ``schema-incompatible`` and its raw bytes
  (the source's ``on_error`` applies: dlq keeps them for ``changelake dlq replay``, fail stops
  the pipeline naming the change). One error is logged per table and
  ``changelake_table_quarantined{table}`` is 1.
* convert: the column keeps the table's type; a message with a value it cannot hold is a dead
  letter (``schema-mismatch``), the others are written.
* keep, skip: counted in ``changelake_schema_changes_not_applied_total``.
* apply: the sink changes the table (:class:`~changelake.connectors.delta_sink.DeltaUpsertSink`),
  logs and counts it (``changelake_schema_changes_total``), and records the position of the schema it
  changed for (``Screened.position``).

The rows then carry exactly the columns the table takes, in its types (:func:`conform`). Dropped columns
are known only from a schema (the newest one): a field that schema-less JSON stops sending just reads
NULL. The functions take one table at a time, so a source routed to many tables screens each
(:meth:`Quarantine.screen`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from changelake import metrics
from changelake.changelog import DEAD_LETTER_SCHEMA, OFFSET, PARTITION, SEQ, TOPIC, user_columns
from changelake.connectors.delta_sink_kernel import kafka_partition_prefix
from changelake.connectors.delta_sink_schema import PROP_TOMBSTONES
from changelake.connectors.schema_positions import (PROP_SCHEMA_POSITION, SourceSchema, follow, position_order,
                                                     schema_positions)
from changelake.log_values import shown
from changelake.service.config import ChangelakeConfig, TableSpecModel
from changelake.service.key_inference import TableKeys

log = logging.getLogger(__name__)

REASON = "schema-incompatible"


@dataclass(frozen=True)
class Screened:
    """What of a route's decoded batch may go to its table: rows, dead letters (the decoder's plus the
    screen's), and the table columns the source's last schema dropped (for the sink)."""

    rows: pa.Table
    dead_letters: pa.Table
    dropped: tuple[str, ...] = ()
    #: the source position of the newest schema the table takes from the batch, to record if it changes
    position: str | None = None


class Quarantine:
    def __init__(self, config: ChangelakeConfig, keys: TableKeys) -> None:
        self.config = config
        self.keys = keys
        self.storage = config.storage.plain_options() or None
        #: quarantined table -> why (the error of its dead letters)
        self.tables: dict[str, str] = {}
        self._logs: dict[str, DeltaTable] = {}
        self._adopted: set[tuple[str, int]] = set()
        #: table -> the newest source position it applied (:meth:`schema_position`)
        self._newest: dict[str, str | None] = {}
        #: routed tables (created on first sight): their tables[] entry and their source's schema_change
        self._routed: dict[str, tuple[TableSpecModel, str]] = {}
        for t in config.tables:
            metrics.TABLE_QUARANTINED.labels(table=t.name).set(0)

    def add_table(self, spec: TableSpecModel, *, source_schema_change: str) -> None:
        """Know a routed table, created on first sight: its settings and its source's ``schema_change``."""
        self._routed[spec.name] = (spec, source_schema_change)
        metrics.TABLE_QUARANTINED.labels(table=spec.name).set(0)

    def _spec(self, table: str) -> TableSpecModel:
        return self._routed[table][0] if table in self._routed else self.config.table(table)

    def _behaviour(self, table: str) -> str:
        if table in self._routed:
            spec, source = self._routed[table]
            return spec.schema_change or source
        return self.config.schema_change_of(table)

    def table_columns(self, table: str) -> pa.Schema | None:
        """The user columns of ``table`` as stored (None before its first commit)."""
        path = self._spec(table).path or self.config.table_path(table)
        try:
            if path in self._logs:
                self._logs[path].update_incremental()
            else:
                self._logs[path] = DeltaTable(path, storage_options=self.storage)
        except TableNotFoundError:
            return None
        schema = pa.schema(self._logs[path].schema().to_arrow())
        return pa.schema([f for f in schema if not f.name.startswith("_")])

    def prepare(self, table: str, decoder: Any, *, added: tuple[str, ...] = ()) -> None:
        """Before a decoder's first batch for ``table``: it starts from the table's columns (``adopt_columns``),
        but those the pipeline adds (``added``, see :meth:`screen`)."""
        if (table, id(decoder)) in self._adopted:
            return
        self._adopted.add((table, id(decoder)))
        columns = self.table_columns(table)
        if columns is not None and added:
            columns = pa.schema([f for f in columns if f.name not in added])
        adopt = getattr(decoder, "adopt_columns", None)
        if columns is not None and adopt is not None:
            adopt(columns)

    def schema_position(self, table: str) -> str | None:
        """The newest source position ``table`` has applied (None: nothing known): kept in memory as batches
        commit (:meth:`advance`); at the first sight of an existing table, the newest of its recorded
        ``changelake.schemaPosition`` and the ``_seq`` of its rows and tombstones. Read after :meth:`table_columns`."""
        if table not in self._newest:
            path = self._spec(table).path or self.config.table_path(table)
            log_ = self._logs.get(path)
            if log_ is None:
                return None
            props = log_.metadata().configuration
            recorded = props.get(PROP_SCHEMA_POSITION)
            found = [recorded] if recorded is not None else []
            logs = [log_]
            if props.get(PROP_TOMBSTONES):
                try:
                    logs.append(DeltaTable(props[PROP_TOMBSTONES], storage_options=self.storage))
                except TableNotFoundError:
                    pass
            prefix = kafka_partition_prefix(recorded) if recorded is not None else None
            where = f" WHERE {SEQ} LIKE '{prefix}%'" if prefix is not None else ""
            for one in logs:
                got = pa.table(QueryBuilder().register("t", one).execute(f'SELECT max("{SEQ}") AS m FROM t{where}'))
                if got.num_rows and got["m"][0].as_py() is not None:
                    found.append(got["m"][0].as_py())
            self._newest[table] = None
            for p in found:
                self.advance({table: p})
        return self._newest[table]

    def advance(self, positions: dict[str, str]) -> None:
        """After a batch committed: each table's newest position applied, where it is newer than the known one
        (a Kafka position only within the known one's partition)."""
        for table, position in positions.items():
            known = self._newest.get(table)
            if known is None or position_order(position, known) == "newer":
                self._newest[table] = position

    def screen(self, table: str, *, source: str, decoder: Any, raw: pa.Table, rows: pa.Table,
               dead_letters: pa.Table, added: tuple[str, ...] = ()) -> Screened:
        """Screen one batch of a source decoded on the driver for ``table`` (module doc); ``added``: table columns
        the pipeline adds to the rows (a routed table's origin columns), which are no source columns."""
        if table in self.tables:
            return Screened(_empty_like(rows), quarantined(raw, self.tables[table]))
        meta = {m.column for m in getattr(decoder, "_meta", ())} | set(added)     # not source columns
        schemas = _source_schemas(decoder, raw, rows, meta)
        columns = self.table_columns(table)
        recorded = self.schema_position(table) if columns is not None else None
        if columns is None:     # the batch creates the table: from the schema of its oldest change, then what
            placed = [s for s in schemas if s.position is not None]     # follows it in position order
            if not placed:
                return Screened(rows, dead_letters)
            newest = max(placed, key=lambda s: s.position)
            oldest = min((s for s in placed if position_order(s.earliest, newest.position) != "unordered"),
                         key=lambda s: s.earliest)
            columns, recorded = oldest.columns, oldest.earliest
        columns = pa.schema([f for f in columns if f.name not in meta])
        behaviour = self._behaviour(table)
        followed = follow(columns, schemas, recorded=recorded, behaviour=behaviour,
                          primary_key=self.keys.key_of(table) or (), partition_by=self._spec(table).partition_by,
                          drops=any(s.position is not None for s in schemas))
        if followed.refused:
            why = (f"table {table!r} (schema_change: {behaviour}) refuses a change of source {source!r}: "
                   + "; ".join(c.describe() for c in followed.refused)
                   + ". Its messages go to the dead-letter path until the pipeline is restarted with a fix: choose "
                   "a schema_change behaviour that takes the change, declare the source's columns, or write the "
                   "table to a new path; then replay the dead letters (changelake dlq replay)")
            self.tables[table] = why
            metrics.TABLE_QUARANTINED.labels(table=table).set(1)
            for c in followed.refused:
                metrics.SCHEMA_CHANGES_NOT_APPLIED.labels(table=table, kind=c.kind, outcome="refuse").inc()
            log.error("table %s is quarantined, it receives no change until a restart: %s", table, why)
            return Screened(_empty_like(rows), quarantined(raw, why))
        for c in followed.changes:
            if c.outcome != "apply":
                metrics.SCHEMA_CHANGES_NOT_APPLIED.labels(table=table, kind=c.kind, outcome=c.outcome).inc()
        if followed.older:
            log.info("table %s: %d schema(s) of source %s older than the table's (position %s) written as they are"
                     "%s", table, followed.older, source, recorded,
                     " (lenient: their added columns and widened types taken)" if behaviour == "lenient" else "")
        rows, dead_letters = conform(rows, dead_letters, raw, followed.target, meta=meta, table=table)
        return Screened(rows, dead_letters, followed.dropped, followed.position)


def _source_schemas(decoder: Any, raw: pa.Table, rows: pa.Table, meta: set[str]) -> list[SourceSchema]:
    """The batch's source schemas with their positions (:mod:`~changelake.connectors.schema_positions`); for
    schema-less input the batch's own columns, without a position (a field not sent is no drop)."""
    schemas = list(getattr(decoder, "source_schemas", None) or ())
    if not schemas:
        return [SourceSchema(rows.select([n for n in user_columns(rows) if n not in meta]).schema, None)]
    per_record = getattr(decoder, "record_schemas", None)
    if per_record is None:
        return [SourceSchema(s, None) for s in schemas]
    positions = schema_positions(raw, per_record, rows, len(schemas))
    return [SourceSchema(s, q[1], q[0]) for s, q in zip(schemas, positions) if q is not None]


def conform(rows: pa.Table, dead_letters: pa.Table, raw: pa.Table, target: pa.Schema, *, meta: set[str],
            table: str) -> tuple[pa.Table, pa.Table]:
    """``rows`` written with the ``target`` source columns: a user column the table does not take (a column it
    dropped, or one an older schema still has) leaves the rows, one of another type is converted to the
    target's (:func:`convert`: a value it cannot hold makes its message a ``schema-mismatch`` dead letter)."""
    user = [n for n in user_columns(rows) if n not in meta]
    gone = [n for n in user if n not in target.names]
    if gone:
        rows = rows.drop_columns(gone)
    types = {n: target.field(n).type for n in user if n in target.names and rows.schema.field(n).type != target.field(n).type}
    if types:
        rows, dead_letters = convert(rows, dead_letters, raw, types, table=table)
    return rows, dead_letters


def quarantined(raw: pa.Table, why: str) -> pa.Table:
    """Every message of ``raw`` (tombstones aside) as a ``schema-incompatible`` dead letter."""
    present = raw.filter(pc.fill_null(pc.greater(pc.binary_length(raw["value"]), 0), False))
    n = present.num_rows
    return pa.table({
        "topic": present["topic"], "partition": present["partition"], "offset": present["offset"],
        "timestamp": present["timestamp"], "key": present["key"], "value": present["value"],
        "reason": pa.array([REASON] * n, pa.string()), "error": pa.array([why] * n, pa.string()),
    }).cast(DEAD_LETTER_SCHEMA)


def convert(rows: pa.Table, dead_letters: pa.Table, raw: pa.Table, types: dict[str, pa.DataType], *,
            table: str) -> tuple[pa.Table, pa.Table]:
    """``rows`` with each column of ``types`` cast to its table type; a message with a value that type cannot
    hold becomes a ``schema-mismatch`` dead letter (all its rows go)."""
    bad: dict[tuple[str, int, int], str] = {}
    for name, target in types.items():
        for i, value in _uncastable(rows[name], target):
            key = (rows[TOPIC][i].as_py(), rows[PARTITION][i].as_py(), rows[OFFSET][i].as_py())
            bad.setdefault(key, f"column {name!r}: value {shown(value)} does not fit the table's type {target}; "
                                f"table {table!r} keeps its type under its schema_change behaviour. Choose "
                                "evolve, try_evolve or lenient to widen the column, then replay this dead letter")
    if bad:
        keep = pa.array([(t, p, o) not in bad for t, p, o in zip(rows[TOPIC].to_pylist(), rows[PARTITION].to_pylist(),
                                                                rows[OFFSET].to_pylist())], pa.bool_())
        rows = rows.filter(keep)
        hit = pa.array([(t, p, o) in bad for t, p, o in zip(raw["topic"].to_pylist(), raw["partition"].to_pylist(),
                                                           raw["offset"].to_pylist())], pa.bool_())
        picked = raw.filter(hit)
        errors = [bad[(t, p, o)] for t, p, o in zip(picked["topic"].to_pylist(), picked["partition"].to_pylist(),
                                                     picked["offset"].to_pylist())]
        extra = pa.table({"topic": picked["topic"], "partition": picked["partition"], "offset": picked["offset"],
                          "timestamp": picked["timestamp"], "key": picked["key"], "value": picked["value"],
                          "reason": pa.array(["schema-mismatch"] * picked.num_rows, pa.string()),
                          "error": pa.array(errors, pa.string())}).cast(DEAD_LETTER_SCHEMA)
        dead_letters = pa.concat_tables([dead_letters.cast(DEAD_LETTER_SCHEMA), extra])
    for name, target in types.items():
        i = rows.schema.get_field_index(name)
        rows = rows.set_column(i, pa.field(name, target), rows[name].cast(target))
    return rows, dead_letters


def _uncastable(column: pa.ChunkedArray, target: pa.DataType) -> list[tuple[int, Any]]:
    """(row, value) of the values of ``column`` that ``target`` cannot hold."""
    try:
        column.cast(target)
        return []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = []
    for i, value in enumerate(column.to_pylist()):
        try:
            pa.array([value], column.type).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append((i, value))
    return out


def _empty_like(rows: pa.Table) -> pa.Table:
    return rows.slice(0, 0)
