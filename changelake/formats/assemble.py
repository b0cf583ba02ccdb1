"""Collects the changes decoded from one batch of raw records and assembles the
changelog table and the dead letters.

Formats do the per-message work (parse, pick the images, work out the log
position) and hand each message's outcome to a :class:`ChangeCollector`; all
column building then happens once per batch and per column, in Arrow.

Every input record ends in exactly one of: changelog rows, one dead letter, one
truncate (its position, for the pipeline's ``on_truncate``), or a counted skip
(tombstone, filtered, DDL, ...).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import DEAD_LETTER_SCHEMA, METADATA_FIELDS, TRUNCATE_SCHEMA
from changelake.formats.base import DecodeResult
from changelake.formats.convert import error_text, to_arrow
from changelake.formats.sequence import POSITIONS_SCHEMA
from changelake.log_values import shown
from changelake.types import type_change

_KIND_TYPE = pa.int8()


@dataclass(frozen=True)
class ColumnSpec:
    """A user column and how its raw values are read.

    ``unit``/``decimal_scale``/``pre`` describe the source encoding (see
    :func:`changelake.formats.convert.to_arrow`); ``pre`` runs first on each
    non-null value. ``wire`` is set for a declared encoding
    (:mod:`changelake.formats.encodings`): only values written that way are accepted.
    """

    name: str
    type: pa.DataType
    nullable: bool = True
    unit: str | None = None
    decimal_scale: int | None = None
    pre: Callable[[Any], Any] | None = None
    wire: str | None = None


@dataclass(frozen=True)
class MetaColumn:
    """A requested metadata column: message-level values converted to ``type``."""

    key: str
    column: str
    type: pa.DataType


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a batch is decoded.

    A batch allocates 10^5-10^6 dicts that all stay alive until it is done; the
    collector would re-scan them again and again (~15% of decode time) though
    they hold no cycles. Restored afterwards, also on error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Reject(Exception):
    """Raised inside a format's per-message code: the message becomes a dead letter."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


class ChangeCollector:
    """Accumulates one batch. Per message: :meth:`message`, then :meth:`row` per change."""

    def __init__(self, records: pa.Table, n_meta: int) -> None:
        self.records = records
        # per message
        self.msg_record: list[int] = []
        self.seq: list[str] = []
        self.source_ts: list[int | None] = []
        self.db: list[str | None] = []
        self.table: list[str | None] = []
        self.meta: list[list[Any]] = [[] for _ in range(n_meta)]
        # per row
        self.kinds: list[int] = []
        self.row_msg: list[int] = []
        self.images: list[dict] = []
        # outcomes that produce no rows
        self.dead: list[tuple[int, str, str]] = []
        self.skipped: Counter[str] = Counter()
        self.truncates: list[tuple[int, str, str | None, str | None]] = []   # record, seq, db, table
        self.positions: list[tuple[int, str | None, int | None, int | None]] = []  # record, marker, order, ts

    def message(self, record: int, seq: str, source_ts: int | None, db: str | None, table: str | None,
                meta: Sequence[Any] = ()) -> int:
        pos = len(self.msg_record)
        self.msg_record.append(record)
        self.seq.append(seq)
        self.source_ts.append(source_ts)
        self.db.append(db)
        self.table.append(table)
        for values, v in zip(self.meta, meta):
            values.append(v)
        return pos

    def row(self, msg: int, kind: int, image: dict) -> None:
        self.kinds.append(kind)
        self.row_msg.append(msg)
        self.images.append(image)

    def reject(self, record: int, reason: str, error: str) -> None:
        self.dead.append((record, reason, error))

    def skip(self, what: str) -> None:
        self.skipped[what] += 1

    def truncate(self, record: int, seq: str, db: Any, table: Any) -> None:
        """A TRUNCATE message at ``seq`` (its position) of ``db``.``table``."""
        self.truncates.append((record, seq, db if isinstance(db, str) else None,
                               table if isinstance(table, str) else None))

    def position(self, record: int, marker: str | None, order: int | None, ts: int | None) -> None:
        """The log position of a message (``changelake.formats.sequence``: its epoch rule reads these)."""
        self.positions.append((record, marker, order, ts))

    # --- assembly ----------------------------------------------------------------

    def finish(self, columns: Sequence[ColumnSpec], meta_columns: Sequence[MetaColumn],
               key: Sequence[str] = ()) -> DecodeResult:
        images = self.images
        arrays: list[pa.Array] = []
        fields: list[pa.Field] = []
        bad_msgs: dict[int, tuple[str, str]] = {}   # message -> (reason, error)
        row_msg = self.row_msg
        for spec, values in zip(columns, _transpose(images, [c.name for c in columns])):
            name = spec.name
            if spec.pre is not None:
                values = _apply_pre(values, spec.pre, name, row_msg, bad_msgs)
            arr, bad = to_arrow(values, spec.type, unit=spec.unit, decimal_scale=spec.decimal_scale, wire=spec.wire)
            for i, why in bad.items():
                bad_msgs.setdefault(row_msg[i], (
                    "schema-mismatch", f"column {name!r}: {why}; fix the producer or "
                                       + ("the column's declared type and encoding" if spec.wire else
                                          "declare the column with a type that holds this value")))
            must_have = name in key or not spec.nullable
            if must_have and arr.null_count:
                reason = "missing-key" if name in key else "schema-mismatch"
                for i in pc.indices_nonzero(pc.is_null(arr)).to_pylist():
                    if i not in bad:
                        bad_msgs.setdefault(row_msg[i], (
                            reason, f"column {name!r} is {'a key column' if name in key else 'NOT NULL'} but the "
                                    f"change has no value for it; fix the producer or the declared "
                                    f"{'key' if name in key else 'column'}"))
            arrays.append(arr)
            fields.append(pa.field(name, spec.type, nullable=spec.nullable))

        msg_index = pa.array(row_msg, type=pa.int64())
        for j, meta in enumerate(meta_columns):
            arr, bad = to_arrow(self.meta[j], meta.type)
            for i, why in bad.items():
                bad_msgs.setdefault(i, ("schema-mismatch", f"metadata {meta.key!r}: {why}"))
            arrays.append(arr.take(msg_index))
            fields.append(pa.field(meta.column, meta.type))

        record_index = pa.array(self.msg_record, type=pa.int64()).take(msg_index)
        recs = self.records
        arrays.append(pa.array(self.kinds, type=_KIND_TYPE))
        arrays.append(pa.array(self.seq, type=pa.string()).take(msg_index))
        arrays.append(recs.column("topic").take(record_index).combine_chunks())
        arrays.append(recs.column("partition").take(record_index).combine_chunks())
        arrays.append(recs.column("offset").take(record_index).combine_chunks())
        source_ts, bad = to_arrow(self.source_ts, METADATA_FIELDS[5].type, unit="ms")
        for i, why in bad.items():
            bad_msgs.setdefault(i, ("schema-mismatch", f"the change's source timestamp: {why}"))
        arrays.append(source_ts.take(msg_index))
        arrays.append(pa.array(self.db, type=pa.string()).take(msg_index))
        arrays.append(pa.array(self.table, type=pa.string()).take(msg_index))
        fields.extend(METADATA_FIELDS)
        rows = pa.Table.from_arrays(arrays, schema=pa.schema(fields))

        dead = list(self.dead)
        if bad_msgs:
            keep = pa.array([m not in bad_msgs for m in row_msg], type=pa.bool_())
            rows = rows.filter(keep)
            for m, (reason, error) in bad_msgs.items():
                dead.append((self.msg_record[m], reason, error))
        return DecodeResult(rows=rows, dead_letters=dead_letters(self.records, dead),
                            skipped=dict(self.skipped), truncates=truncates(self.records, self.truncates),
                            positions=positions(self.records, self.positions))


def _transpose(images: list[dict], names: list[str]) -> list[Sequence[Any]]:
    """Per-column value sequences of the row images (absent keys read as null)."""
    if not names:
        return []
    if not images:
        return [()] * len(names)
    if len(names) == 1:
        return [[img.get(names[0]) for img in images]]
    getter = itemgetter(*names)
    try:
        rows = list(map(getter, images))          # one C call per row when every key is present
    except KeyError:
        rows = [tuple(img.get(n) for n in names) for img in images]
    return list(zip(*rows))


def _apply_pre(values: Sequence[Any], pre: Callable[[Any], Any], name: str, row_msg: list[int],
               bad_msgs: dict[int, tuple[str, str]]) -> list[Any]:
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(pre(v))
        except Exception as exc:  # noqa: BLE001 - any failure of a value is a dead letter, never a crash
            bad_msgs.setdefault(row_msg[i], ("schema-mismatch", f"column {name!r}: value {shown(v)} cannot be "
                                                                f"read: {error_text(exc)}; fix the producer or the "
                                                                "declared column type"))
            out.append(None)
    return out


def dead_letters(records: pa.Table, dead: list[tuple[int, str, str]]) -> pa.Table:
    """Dead-letter rows (in input order) for ``(record index, reason, error)`` triples."""
    if not dead:
        return DEAD_LETTER_SCHEMA.empty_table()
    dead.sort(key=lambda d: d[0])
    idx = pa.array([d[0] for d in dead], type=pa.int64())
    picked = records.select(["topic", "partition", "offset", "timestamp", "key", "value"]).take(idx)
    arrays = [picked.column(n).combine_chunks() for n in picked.column_names]
    arrays.append(pa.array([d[1] for d in dead], type=pa.string()))
    arrays.append(pa.array([d[2] for d in dead], type=pa.string()))
    return pa.Table.from_arrays(arrays, schema=DEAD_LETTER_SCHEMA)


def truncates(records: pa.Table, found: list[tuple[int, str, str | None, str | None]]) -> pa.Table:
    """Truncate rows (:data:`~changelake.changelog.TRUNCATE_SCHEMA`) for ``(record index, seq, db, table)``."""
    if not found:
        return TRUNCATE_SCHEMA.empty_table()
    idx = pa.array([t[0] for t in found], type=pa.int64())
    picked = records.select(["topic", "partition", "offset"]).take(idx)
    return pa.Table.from_arrays(
        [*(picked.column(n).combine_chunks() for n in ("topic", "partition", "offset")),
         pa.array([t[1] for t in found], pa.string()), pa.array([t[2] for t in found], pa.string()),
         pa.array([t[3] for t in found], pa.string())], schema=TRUNCATE_SCHEMA)


def positions(records: pa.Table, found: list[tuple[int, str | None, int | None, int | None]]) -> pa.Table:
    """Position rows (:data:`~changelake.formats.sequence.POSITIONS_SCHEMA`) for ``(record, marker, order, ts)``."""
    if not found:
        return POSITIONS_SCHEMA.empty_table()
    idx = pa.array([t[0] for t in found], type=pa.int64())
    picked = records.select(["topic", "partition", "offset"]).take(idx)
    return pa.Table.from_arrays(
        [*(picked.column(n).combine_chunks() for n in ("topic", "partition", "offset")),
         pa.array([t[1] for t in found], pa.string()), pa.array([t[2] for t in found], pa.int64()),
         pa.array([t[3] for t in found], pa.int64())], schema=POSITIONS_SCHEMA)


def infer_columns(images: list[dict]) -> list[ColumnSpec]:
    """Columns for schema-less input: names in order of first appearance; types inferred
    from all values of the batch (int64, float64, bool, else string) - deterministic for
    the same batch."""
    names: dict[str, None] = {}
    for img in images:
        for k in img:
            if k not in names:
                names[k] = None
    specs = []
    for name in names:
        values = [img.get(name) for img in images]
        specs.append(ColumnSpec(name, _infer_type(values)))
    return specs


def evolve_specs(known: Sequence[ColumnSpec], incoming: Sequence[ColumnSpec]) -> list[ColumnSpec]:
    """The columns to read with after a source's columns changed: every known column (a dropped one
    reads null), a widened one with its new type, then the new columns. A narrowed or otherwise changed
    type keeps the known type (the table decides what happens: ``delta_sink_schema``)."""
    by_name = {s.name: s for s in incoming}
    out = []
    for s in known:
        new = by_name.get(s.name)
        moved = type_change(s.type, new.type) if new is not None else None
        if moved == "widen":
            out.append(new)
        elif moved in ("same", "narrow"):     # the known type, read with the encoding the source reports
            out.append(ColumnSpec(s.name, s.type, s.nullable, unit=new.unit, decimal_scale=new.decimal_scale,
                                  pre=new.pre, wire=s.wire))
        else:
            out.append(s)
    names = {s.name for s in known}
    return out + [s for s in incoming if s.name not in names]


def new_fields(images: list[dict], known: Sequence[ColumnSpec]) -> list[ColumnSpec]:
    """Columns for the fields of schema-less row images that ``known`` lacks, typed from their values
    in this batch (as :func:`infer_columns`)."""
    names = {s.name for s in known}
    seen: dict[str, None] = {}
    for img in images:
        if img.keys() - names:
            for k in img:
                if k not in names:
                    seen[k] = None
    return [ColumnSpec(name, _infer_type([img.get(name) for img in images])) for name in seen]


def _infer_type(values: list[Any]) -> pa.DataType:
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return pa.bool_()
    if kinds == {int}:
        return pa.int64()
    if kinds and kinds <= {int, float}:
        return pa.float64()
    return pa.string()


def merge_results(results: Sequence[DecodeResult]) -> DecodeResult:
    """One result from the results of consecutive chunks of a batch (in order)."""
    if len(results) == 1:
        return results[0]
    skipped: Counter[str] = Counter()
    for r in results:
        skipped.update(r.skipped)
    return DecodeResult(rows=pa.concat_tables([r.rows for r in results]),
                        dead_letters=pa.concat_tables([r.dead_letters for r in results]),
                        skipped=dict(skipped), truncates=pa.concat_tables([r.truncates for r in results]),
                        positions=pa.concat_tables([r.positions for r in results]))


class SchemaMixin:
    """``columns`` and ``output_schema`` of a decoder that keeps ``_specs`` (user columns, None
    while unknown) and ``_meta`` (requested metadata columns)."""

    _specs: list[ColumnSpec] | None
    _meta: list[MetaColumn]

    def adopt_columns(self, columns: pa.Schema) -> None:
        """Start from the user columns of the table the decoder's rows go to (after a restart the decoder
        has not seen the earlier schemas): the columns the messages bring are then read as the table
        holds them, and compared with it. Declared columns, or columns already known, stay."""
        if getattr(self, "_declared", None) is None and self._specs is None:
            meta = {m.column for m in self._meta}
            self._specs = [ColumnSpec(f.name, f.type) for f in columns if f.name not in meta]

    @property
    def columns(self) -> pa.Schema | None:
        """The user columns (None until the first batch with data, when neither declared nor in a schema)."""
        if self._specs is None:
            return None
        return pa.schema([pa.field(s.name, s.type, s.nullable) for s in self._specs])

    @property
    def output_schema(self) -> pa.Schema | None:
        """Schema of ``decode(...).rows``: user columns, requested metadata columns, then the reserved
        columns (None while the user columns are not known yet)."""
        columns = self.columns
        if columns is None:
            return None
        return pa.schema([*columns, *(pa.field(m.column, m.type) for m in self._meta), *METADATA_FIELDS])
