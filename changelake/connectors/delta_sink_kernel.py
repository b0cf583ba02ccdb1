"""Engine-neutral batch logic of the Delta upsert sink: pure Arrow, no Delta I/O.

Per batch, per primary key (``seq`` = the change's ``_seq``; ``tomb`` = the
key's tombstone ``_seq`` if it has one; ``row`` = the table row's ``_seq``)::

    -U                       -> ignored (a retraction; its +U follows under the same key, or
                                it was a key change, which arrives as -D, +I instead)
    several changes of a key -> only the last change of the greatest _seq survives (changes
                                sharing a _seq come from one message, in batch order)
    +I/+U, tomb >= seq       -> dropped: resurrections_prevented
    +I/+U, otherwise         -> MERGE: insert if no row, update if row < seq, else stale
                                and, when tomb < seq, the tombstone is removed
    -D,    tomb > seq        -> dropped: stale
    -D,    otherwise         -> MERGE: delete if row < seq (else stale)
                                and tombstone (key, seq, now) written when tomb < seq or absent

The MERGE itself (``row < seq``) runs in the engine; everything above is here.

Truncates (``on_truncate: apply``; ``trunc`` = the position of the latest truncate the table
recorded, the table property ``changelake.truncatedBefore``), before all of the above::

    a truncate at T > trunc  -> record trunc = T, then delete every table row with row < T
                                (before the batch's MERGE; both idempotent, so a replay redoes them)
    any change, seq < trunc  -> dropped: before_truncate (it happened before the table was emptied)

Unavailable values (``TableSpec.unavailable_value``: the placeholder a connector writes for a
value it did not send, such as an unchanged TOASTed Postgres column), before the reduction::

    +I/+U holding the placeholder in a text or bytes column
        -> the value of the key's previous +I/+U in the batch, when there is one
        -> NULL when the key's previous change in the batch is a -D (nothing is stored any more)
        -> else the MERGE keeps the table row's value (no row: NULL); the placeholder is never stored

Positions compare as strings, which orders database log positions (``l...``) of one source
everywhere, but Kafka positions (``k<partition><offset>``) only within one partition: a truncate
at a Kafka position meets no change of another partition (:func:`check_truncate_order`).

NULL keys: a key column listed in ``nullable_key`` (a graph table keyed by a group or
partition key that may be NULL, see ``TableSpec``) may hold NULL, and NULL is then one key
value like any other, as a SQL GROUP BY has it: the reduction, the tombstone lookup and the
engines' MERGE match NULL with NULL. A NULL in any other key column fails the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ, RowKind
from changelake.connectors.delta_sink_schema import DELETED_AT, DELETED_AT_TYPE
from changelake.errors import SinkCommitError

_VALID_KINDS = pa.array([int(k) for k in RowKind], pa.int8())
_ROW = "__changelake_row"
_TOMB_SEQ = "__changelake_tomb_seq"
_NULL_FLAG = "__changelake_key_is_null_"


def validate_changes(changes: pa.Table, *, primary_key: Sequence[str], table: str,
                     nullable_key: Sequence[str] = ()) -> pa.Table:
    """Check what the sink relies on; raise :class:`SinkCommitError` before anything is written.

    Key columns in ``nullable_key`` may hold NULL; the others, ``_seq`` and ``_kind`` may not.
    """
    if isinstance(changes, pa.RecordBatch):
        changes = pa.Table.from_batches([changes])
    if not isinstance(changes, pa.Table):
        raise TypeError(f"changes must be a pyarrow.Table, got {type(changes).__name__}")
    missing = [c for c in (*primary_key, KIND, SEQ) if c not in changes.column_names]
    if missing:
        raise SinkCommitError(
            f"batch for table {table} lacks column(s) {missing}; every change must carry the primary key "
            f"{list(primary_key)} and the reserved columns {KIND}, {SEQ} (route such rows to the dead-letter path)")
    for name in (*[k for k in primary_key if k not in nullable_key], SEQ, KIND):
        nulls = changes[name].null_count
        if nulls:
            raise SinkCommitError(
                f"batch for table {table} has {nulls} row(s) with a null {name!r}; "
                "route changes with null primary key or ordering columns to the dead-letter path")
    if not pa.types.is_string(changes.schema.field(SEQ).type) and \
            not pa.types.is_large_string(changes.schema.field(SEQ).type):
        raise SinkCommitError(f"batch for table {table}: {SEQ} must be a string column, "
                              f"got {changes.schema.field(SEQ).type}")
    kinds = changes[KIND].cast(pa.int8())
    bad = pc.sum(pc.invert(pc.is_in(kinds, value_set=_VALID_KINDS))).as_py() or 0
    if bad:
        raise SinkCommitError(f"batch for table {table} has {bad} row(s) with an unknown {KIND} code; "
                              "valid codes are 0 (+I), 1 (-U), 2 (+U), 3 (-D)")
    return changes.set_column(changes.schema.get_field_index(KIND), KIND, kinds)


def latest_per_key(changes: pa.Table, *, primary_key: Sequence[str]) -> pa.Table:
    """Drop ``-U`` rows and keep, per key (NULL is one key value), the last change (batch order) of the greatest ``_seq``.

    Equal ``_seq`` means one message: a chain of key changes in a multi-row message can give a key
    ``-D`` then ``+I`` at one ``_seq``, and the ``+I`` is the key's final state.
    """
    kept = changes.filter(pc.not_equal(changes[KIND], pa.scalar(int(RowKind.UPDATE_BEFORE), pa.int8())))
    if kept.num_rows <= 1:
        return kept
    order, starts = _key_runs(kept, primary_key, "descending")
    return kept.take(order.filter(pa.array(starts)))


def _key_runs(changes: pa.Table, primary_key: Sequence[str], direction: str) -> tuple[pa.Array, np.ndarray]:
    """The rows' order by key, then ``_seq`` and batch position (both in ``direction``), and a mask
    of that order that is True where a new key starts."""
    position = pa.array(np.arange(changes.num_rows, dtype=np.int64))
    order = pc.sort_indices(changes.append_column(_ROW, position),
                            sort_keys=[(k, "ascending") for k in primary_key] + [(SEQ, direction), (_ROW, direction)])
    n = changes.num_rows
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for name in primary_key:
        col = changes[name].take(order).combine_chunks()
        starts[1:] |= _differs(col.slice(1), col.slice(0, n - 1))
    return order, starts


def fill_unavailable(changes: pa.Table, *, primary_key: Sequence[str], placeholder: str | None) -> pa.Table:
    """Each placeholder of a +I/+U replaced by the value of the key's previous +I/+U in the batch (see above)."""
    if placeholder is None or changes.num_rows == 0:
        return changes
    columns = unavailable_columns(changes, placeholder)
    if not columns:
        return changes
    order, starts = _key_runs(changes, primary_key, "ascending")
    kinds = changes[KIND].take(order).to_pylist()
    rows = order.to_pylist()
    for name in columns:
        values = changes[name].take(order).to_pylist()
        needle = placeholder_value(changes.schema.field(name).type, placeholder)
        known, carried = False, None            # known: the key's value is known from this batch
        for i, kind in enumerate(kinds):
            if starts[i]:
                known, carried = False, None
            if kind == RowKind.DELETE:
                known, carried = True, None         # after a delete there is no stored value: NULL
            elif kind != RowKind.UPDATE_BEFORE:
                if values[i] != needle:
                    known, carried = True, values[i]    # a NULL too: the placeholder after it means NULL
                elif known:
                    values[i] = carried
        filled = [None] * changes.num_rows
        for i, row in enumerate(rows):
            filled[row] = values[i]
        index = changes.schema.get_field_index(name)
        changes = changes.set_column(index, changes.schema.field(index), pa.array(filled, changes.schema.field(name).type))
    return changes


def unavailable_columns(changes: pa.Table, placeholder: str | None) -> list[str]:
    """The text and bytes columns of ``changes`` in which some row holds the placeholder."""
    if placeholder is None:
        return []
    found = []
    for f in changes.schema:
        if f.name.startswith("_"):
            continue
        needle = placeholder_value(f.type, placeholder)
        if needle is not None and pc.any(pc.equal(changes[f.name], pa.scalar(needle, f.type))).as_py():
            found.append(f.name)
    return found


def placeholder_value(type_: pa.DataType, placeholder: str) -> str | bytes | None:
    """The placeholder as a value of a text (itself) or bytes (its UTF-8) column; None for other types."""
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return placeholder
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return placeholder.encode()
    return None


def drop_before_truncate(changes: pa.Table, truncated_before: str | None) -> tuple[pa.Table, int]:
    """``changes`` without those older than the table's truncate position, and how many those were."""
    if truncated_before is None or changes.num_rows == 0:
        return changes, 0
    check_truncate_order(changes[SEQ], truncated_before)
    keep = pc.greater_equal(changes[SEQ], pa.scalar(truncated_before, pa.string()))
    kept = changes.filter(keep)
    return kept, changes.num_rows - kept.num_rows


def kafka_partition_prefix(seq: str) -> str | None:
    """``k<partition>`` of an ordering token made from a Kafka position, else None."""
    return seq[:6] if seq.startswith("k") else None


def check_truncate_order(seqs: pa.ChunkedArray | pa.Array, truncated_before: str, *, table: str = "") -> None:
    """Raise when a truncate at a Kafka position would be compared with changes of another partition."""
    prefix = kafka_partition_prefix(truncated_before)
    if prefix is None or len(seqs) == 0:
        return
    other = pc.and_(pc.starts_with(seqs, "k"), pc.invert(pc.starts_with(seqs, prefix)))
    if pc.any(other).as_py():
        raise SinkCommitError(truncate_order_error(truncated_before, table))


def truncate_order_error(truncated_before: str, table: str) -> str:
    partition, offset = int(truncated_before[1:6]), int(truncated_before[6:])
    return (f"table {table or '?'}: the truncate at Kafka partition {partition}, offset {offset} cannot be ordered "
            "against changes of the table's other partitions: this format has no database log position, and "
            "Kafka offsets order changes only within one partition. Give the table's topic one partition, use a "
            "format that carries log positions (Debezium, Maxwell with output_binlog_position, OGG with pos), or "
            "set the source's on_truncate to skip or fail")


def _differs(a: pa.Array, b: pa.Array) -> np.ndarray:
    """``a[i]`` and ``b[i]`` differ, as one key of the MERGE: NULL equal to NULL only (sorting puts a key's
    NULLs side by side), and for floating keys NaN equal to NaN (-0.0 already equals 0.0)."""
    ne = pc.not_equal(a, b)
    if pa.types.is_floating(a.type):
        ne = pc.and_not(ne, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    if not (a.null_count or b.null_count):
        return ne.to_numpy(zero_copy_only=False)
    one_null = pc.not_equal(pc.is_null(a), pc.is_null(b))
    return pc.or_(one_null, pc.fill_null(ne, False)).to_numpy(zero_copy_only=False)


def _merge_equal(column: pa.ChunkedArray | pa.Array):
    """A floating key column with -0.0 as 0.0 and every NaN as one NaN, so that an Arrow join (which
    compares bits) matches the keys the MERGE (SQL equality) matches."""
    if not pa.types.is_floating(column.type):
        return column
    column = pc.if_else(pc.equal(column, 0), pa.scalar(0, column.type), column)
    return pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), column.type), column)


@dataclass(frozen=True)
class TombstoneSplit:
    """A reduced batch split against the key's tombstones."""

    table_changes: pa.Table       # to MERGE into the sink table (user columns, _seq, ..., _kind)
    tombstone_changes: pa.Table   # key, _seq, _kind, _deleted_at: -D to record, +I/+U to clear
    resurrections_prevented: int
    stale_deletes: int


def split_against_tombstones(reduced: pa.Table, tombstones: pa.Table, *, primary_key: Sequence[str],
                             now: datetime) -> TombstoneSplit:
    """Apply the tombstone rows of the table in the module docstring.

    ``reduced`` has one change per key; ``tombstones`` has the key columns and ``_seq``.
    """
    tomb_seq = _lookup_tombstone_seq(reduced, tombstones, primary_key)
    seq = reduced[SEQ]
    is_delete = pc.equal(reduced[KIND], pa.scalar(int(RowKind.DELETE), pa.int8()))
    tomb_newer_or_same = pc.fill_null(pc.greater_equal(tomb_seq, seq), False)
    tomb_newer = pc.fill_null(pc.greater(tomb_seq, seq), False)
    tomb_older = pc.fill_null(pc.less(tomb_seq, seq), False)

    blocked = pc.and_(pc.invert(is_delete), tomb_newer_or_same)
    stale_delete = pc.and_(is_delete, tomb_newer)
    table_changes = reduced.filter(pc.invert(pc.or_(blocked, stale_delete)))

    record = pc.and_(is_delete, pc.invert(tomb_newer_or_same))
    clear = pc.and_(pc.invert(is_delete), tomb_older)
    tomb_rows = reduced.filter(pc.or_(record, clear)).select([*primary_key, SEQ, KIND])
    stamp = pa.array(np.full(tomb_rows.num_rows, _micros(now), dtype=np.int64)).cast(DELETED_AT_TYPE)
    tomb_rows = tomb_rows.append_column(pa.field(DELETED_AT, DELETED_AT_TYPE), stamp)
    return TombstoneSplit(
        table_changes=table_changes,
        tombstone_changes=tomb_rows,
        resurrections_prevented=pc.sum(blocked).as_py() or 0,
        stale_deletes=pc.sum(stale_delete).as_py() or 0,
    )


def _micros(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError("the sink's clock must return timezone-aware datetimes")
    return round(moment.timestamp() * 1_000_000)


def _lookup_tombstone_seq(reduced: pa.Table, tombstones: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """The tombstone ``_seq`` of each row of ``reduced`` (null where the key has none), in row order."""
    if tombstones.num_rows == 0 or reduced.num_rows == 0:
        return pa.nulls(reduced.num_rows, pa.string())
    keys = list(primary_key)
    tomb_keys, batch_keys, on = _tombstone_and_batch_keys(tombstones, reduced, keys)
    left = batch_keys.append_column(_ROW, pa.array(np.arange(reduced.num_rows, dtype=np.int64)))
    right = tomb_keys.append_column(_TOMB_SEQ, tombstones[SEQ].cast(pa.string()))
    if right.num_rows > reduced.num_rows:
        # The tombstone table can be far larger than the batch: keep only the batch's keys first
        # (a semi join hashes the batch side), so the outer join below stays batch-sized.
        numbered = tomb_keys.append_column(_ROW, pa.array(np.arange(right.num_rows, dtype=np.int64)))
        hits = numbered.join(batch_keys, keys=on, join_type="left semi")
        right = right.take(hits[_ROW])
    joined = left.join(right, keys=on, join_type="left outer")
    order = pc.sort_indices(joined[_ROW])
    return joined[_TOMB_SEQ].take(order).combine_chunks()


def without_views(table: pa.Table) -> pa.Table:
    """``table`` with its string and binary view columns (what DataFusion reads) as plain string and binary,
    which every Arrow kernel takes."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in plain for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


def apply_tombstone_changes(tombstones: pa.Table, changes: pa.Table, *, primary_key: Sequence[str]) -> pa.Table:
    """``tombstones`` (key columns and ``_seq``) as the tombstone MERGE of ``changes`` leaves them
    (``TombstoneSplit.tombstone_changes``, split against these same tombstones): a -D row records its key's
    tombstone or moves it to the row's ``_seq``, any other row clears it. In the tombstones' own types."""
    keys = list(primary_key)
    columns = [*keys, SEQ]
    tombstones = tombstones.select(columns)
    if changes.num_rows == 0:
        return tombstones
    if tombstones.num_rows:
        kept_keys, changed_keys, on = _tombstone_and_batch_keys(tombstones, changes, keys)
        numbered = kept_keys.append_column(_ROW, pa.array(np.arange(tombstones.num_rows, dtype=np.int64)))
        untouched = numbered.join(changed_keys, keys=on, join_type="left anti")
        tombstones = tombstones.take(untouched[_ROW])
    recorded = changes.filter(pc.equal(changes[KIND], pa.scalar(int(RowKind.DELETE), pa.int8()))).select(columns)
    return pa.concat_tables([tombstones, recorded.cast(tombstones.schema)])


def _tombstone_and_batch_keys(tombstones: pa.Table, batch: pa.Table,
                              keys: list[str]) -> tuple[pa.Table, pa.Table, list[str]]:
    """The key columns of ``tombstones`` (in the batch's types) and of ``batch``, as the MERGE compares them
    (:func:`_merge_equal`), ready for an Arrow join in which NULL meets NULL (:func:`_null_safe_keys`)."""
    return _null_safe_keys(pa.table({k: _merge_equal(tombstones[k].cast(batch.schema.field(k).type)) for k in keys}),
                           pa.table({k: _merge_equal(batch[k]) for k in keys}), keys)


def _null_safe_keys(a: pa.Table, b: pa.Table, key: Sequence[str]) -> tuple[pa.Table, pa.Table, list[str]]:
    """Key columns of ``a`` and ``b`` for an Arrow join in which NULL meets NULL (a plain join
    matches no NULL): a key column that has NULLs becomes whether the value is NULL, plus the
    value with NULLs filled by one of the column's values (any will do beside the NULL flag)."""
    left: dict[str, pa.ChunkedArray] = {}
    right: dict[str, pa.ChunkedArray] = {}
    for i, k in enumerate(key):
        x, y = a[k], b[k]
        if x.null_count or y.null_count:
            flag = f"{_NULL_FLAG}{i}"
            left[flag], right[flag] = pc.is_null(x), pc.is_null(y)
            values = pc.drop_null(pa.chunked_array(x.chunks + y.chunks, x.type))
            if len(values) == 0:
                continue                # NULL on both sides: the flag is the whole match
            x, y = pc.fill_null(x, values[0]), pc.fill_null(y, values[0])
        left[k], right[k] = x, y
    return pa.table(left), pa.table(right), list(left)


def align_to_table(reduced: pa.Table, target_schema: pa.Schema) -> pa.Table:
    """The batch with exactly the table's columns (cast, NULL where absent), plus ``_kind``."""
    columns = []
    for field in target_schema:
        if field.name in reduced.column_names:
            columns.append(reduced[field.name].cast(field.type))
        elif field.nullable:
            columns.append(pa.nulls(reduced.num_rows, field.type))
        else:
            raise SinkCommitError(f"column {field.name!r} is NOT NULL in the table but absent from the batch; "
                                  "send it in every change or make the column nullable")
    columns.append(reduced[KIND])
    schema = pa.schema([f.with_nullable(True) for f in target_schema] + [pa.field(KIND, pa.int8())])
    return pa.Table.from_arrays(columns, schema=schema)


def count_deletes(changes: pa.Table) -> int:
    """Number of ``-D`` rows."""
    return pc.sum(pc.equal(changes[KIND], pa.scalar(int(RowKind.DELETE), pa.int8()))).as_py() or 0
