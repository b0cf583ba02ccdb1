"""The bulk path of the Debezium decoders.

When a chunk of messages is healthy - every value is valid UTF-8 and parses as
JSON of the expected shape, with the declared column types, dates in range, and
only ops c/r/u/d with the images they need - Arrow's JSON reader parses the whole chunk straight into
columns, without a Python object per value, and the changelog is assembled
with vectorized takes (:func:`assemble`, shared with the Avro bulk path).
Anything else (a tombstone is fine) makes :func:`decode_json_chunk` return None and the chunk goes through the per-message
path, which isolates and explains every bad message. Both paths produce the
same rows (a differential test holds them equal).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.types as pat

from changelake.changelog import DEAD_LETTER_SCHEMA, METADATA_FIELDS
from changelake.formats.assemble import ColumnSpec, MetaColumn
from changelake.formats.base import DecodeResult
from changelake.formats.convert import _rescale, outside, to_float
from changelake.formats.sequence import POSITIONS_SCHEMA

_SOURCE = pa.struct([("ts_ms", pa.int64()), ("db", pa.string()), ("schema", pa.string()),
                     ("table", pa.string()), ("file", pa.string()), ("pos", pa.int64()), ("row", pa.int64()),
                     ("lsn", pa.int64()), ("server_id", pa.int64()), ("gtid", pa.string()),
                     ("sequence", pa.string())])
#: declared wire encodings the JSON reader enforces itself: it refuses any value of another JSON type
#: (an ``int`` encoding reads int64, ``decimal-text`` reads strings); text timestamps and bytes go
#: message by message
_BULK_WIRES = (None, "int", "decimal-text")
_SIMPLE_META = {"ingestion-timestamp", "source.timestamp", "source.database", "source.schema", "source.table"}


def _raw_type(spec: ColumnSpec) -> pa.DataType | None:
    """How Arrow's JSON reader reads the column (None: the bulk path cannot)."""
    t = spec.type
    if spec.pre is not None or spec.decimal_scale is not None or spec.wire not in _BULK_WIRES:
        return None
    if pat.is_floating(t):
        return pa.float64()   # then cast, as the per-message path does: same float32 rounding
    if pat.is_boolean(t) or pat.is_integer(t) or pat.is_string(t):
        return t
    if pat.is_timestamp(t) or pat.is_time(t) or pat.is_duration(t) or pat.is_date32(t):
        return pa.int64()
    if pat.is_decimal(t):
        return pa.string()
    return None


class BulkPlan:
    """What the bulk path needs to know about a decoder's columns; built once."""

    def __init__(self, specs: Sequence[ColumnSpec], meta: Sequence[MetaColumn], *, envelope: bool,
                 new_fields: bool = False) -> None:
        """``new_fields``: the columns come from the data (schema-less, none declared), so a chunk whose rows
        carry a field the specs lack goes to the per-message path, which adds the column."""
        raw = [_raw_type(s) for s in specs]
        self.new_fields = new_fields
        self.usable = all(r is not None for r in raw) and all(m.key in _SIMPLE_META for m in meta)
        self.specs = list(specs)
        self.meta = list(meta)
        if not self.usable:
            return
        row = pa.struct([pa.field(s.name, r) for s, r in zip(specs, raw)])
        body = pa.struct([("before", row), ("after", row), ("op", pa.string()), ("source", _SOURCE),
                          ("ts_ms", pa.int64())])
        schema = pa.schema([("payload", body)]) if envelope else pa.schema(list(body))
        self.envelope = envelope
        self.parse_options = pj.ParseOptions(explicit_schema=schema,
                                             unexpected_field_behavior="infer" if new_fields else "ignore")


def decode_json_chunk(plan: BulkPlan, records: pa.Table, *, key: Sequence[str]) -> DecodeResult | None:
    """Decode a chunk of Debezium JSON in bulk, or None when it needs the per-message path."""
    values = records.column("value").combine_chunks()
    idx = present_values(values)
    n = len(idx)
    if n == 0:
        return None
    present = values.take(pa.array(idx))
    if not utf8_valid(present):
        # Arrow's JSON reader does not check the UTF-8 of every string it reads (values in nested
        # objects, fields it ignores): an invalid message would reach a table. orjson checks the
        # whole document, so the per-message path turns it into a 'malformed' dead letter.
        return None
    # every message must be one JSON object: '{' first, '}' last. Besides being the shape we read, this
    # keeps other top-level values away from Arrow's JSON reader (pyarrow 26 crashes on a first line
    # that is a bare `null`).
    if not (pc.all(pc.starts_with(present, "{")).as_py() and pc.all(pc.ends_with(present, "}")).as_py()):
        return None
    data = lines_of(present)
    if data.count(b"\n") != n:
        return None   # a value holds a line break (pretty-printed JSON): one message per line is needed
    try:
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False,
                                                                          block_size=len(data) + 1),
                             parse_options=plan.parse_options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != n:
        return None
    body = _single(table.column("payload")) if plan.envelope else \
        pa.StructArray.from_arrays([_single(table.column(c)) for c in table.column_names], names=table.column_names)
    if plan.new_fields and _has_new_fields(body, {s.name for s in plan.specs}):
        return None
    return assemble(body, records, idx, plan.specs, plan.meta, key=key)


def lines_of(values: pa.BinaryArray) -> bytes:
    """The values, each followed by a line break, as one string (built by Arrow, no Python object per value)."""
    lines = pc.binary_join_element_wise(values, pa.scalar(b"", values.type), pa.scalar(b"\n", values.type))
    _, offsets, data = lines.buffers()
    width = np.int64 if pat.is_large_binary(lines.type) else np.int32
    first, last = np.frombuffer(offsets, dtype=width)[[lines.offset, lines.offset + len(lines)]]
    return data[int(first):int(last)].to_pybytes()


def _has_new_fields(body: pa.StructArray, names: set[str]) -> bool:
    """Whether a row image (before / after) of the chunk has a field outside ``names``."""
    for side in ("before", "after"):
        idx = body.type.get_field_index(side)
        if idx >= 0 and pa.types.is_struct(body.type.field(idx).type) and \
                any(f.name not in names for f in body.type.field(idx).type):
            return True
    return False


def utf8_valid(values: pa.Array) -> bool:
    """Whether every value of a binary array is valid UTF-8 (Arrow's checked cast, ~1 GB/s)."""
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:
        return False
    return True


def _single(column: pa.ChunkedArray) -> pa.Array:
    # one block was read, so normally one chunk: take it without copying
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def present_values(values: pa.Array) -> np.ndarray:
    """Indices of the records whose value is neither null nor empty (the others are tombstones)."""
    present = pc.fill_null(pc.greater(pc.binary_length(values), 0), False)
    return np.flatnonzero(present.to_numpy(zero_copy_only=False))


def assemble(body: pa.StructArray, records: pa.Table, idx: np.ndarray, specs: Sequence[ColumnSpec],
             meta: Sequence[MetaColumn], *, key: Sequence[str]) -> DecodeResult | None:
    """The changelog of ``n`` decoded Debezium envelopes (``body``: before, after, op, source, ts_ms)
    that came from ``records[idx]``; None if any of them needs the per-message path."""
    n = len(idx)
    if body.null_count:
        return None
    op = _field(body, "op").cast(pa.string())
    before, after = _field(body, "before"), _field(body, "after")
    if pat.is_null(before.type) and pat.is_struct(after.type):
        before = pa.nulls(n, after.type)      # a writer that never sets 'before' (e.g. insert-only)
    if pat.is_null(after.type) and pat.is_struct(before.type):
        after = pa.nulls(n, before.type)
    if not pat.is_struct(before.type) or before.type != after.type:
        return None
    is_c = pc.is_in(op, pa.array(["c", "r"]))
    is_u = pc.equal(op, "u")
    is_d = pc.equal(op, "d")
    known = pc.or_(pc.or_(is_c, is_u), is_d)
    if op.null_count or not pc.all(known).as_py():
        return None
    has_before, has_after = before.is_valid(), after.is_valid()
    if not pc.all(pc.or_(pc.invert(pc.or_(is_c, is_u)), has_after)).as_py():
        return None
    if not pc.all(pc.or_(pc.invert(pc.or_(is_u, is_d)), has_before)).as_py():
        return None   # missing before-images (or upsert updates): the per-message path handles them

    u = is_u.to_numpy(zero_copy_only=False)
    c = is_c.to_numpy(zero_copy_only=False)
    counts = np.where(u, 2, 1)
    starts = np.cumsum(counts) - counts
    msg = np.arange(n)
    take = np.empty(int(counts.sum()), dtype=np.int64)
    take[starts] = np.where(c, n + msg, msg)           # after for c/r, before for u/d
    take[starts[u] + 1] = n + msg[u]                    # after of an update
    kinds = np.empty(len(take), dtype=np.int8)
    kinds[starts] = np.where(c, 0, np.where(u, 1, 3))
    kinds[starts[u] + 1] = 2
    row_msg = pa.array(np.repeat(msg, counts))

    images = pa.concat_arrays([before, after]).take(pa.array(take))
    arrays, fields = [], []
    for spec in specs:
        arr = _finish_column(spec, _field(images, spec.name))
        if arr is None:
            return None
        if (spec.name in key or not spec.nullable) and arr.null_count:
            return None
        arrays.append(arr)
        fields.append(pa.field(spec.name, spec.type, nullable=spec.nullable))

    source = _field(body, "source")
    source_ts = _to_ms(_field(source, "ts_ms"))
    if source_ts is None:
        return None
    for m in meta:
        value = _meta(m.key, body, source)
        value = _to_ms(value) if pat.is_timestamp(m.type) else value.cast(m.type)
        if value is None:
            return None
        arrays.append(value.take(row_msg))
        fields.append(pa.field(m.column, m.type))

    record_index = pa.array(idx).take(row_msg)
    partitions = records.column("partition").combine_chunks().take(pa.array(idx))
    offsets = records.column("offset").combine_chunks().take(pa.array(idx))
    seqs = _sequences(source, partitions, offsets)
    if seqs is None:
        return None
    arrays.append(pa.array(kinds, type=pa.int8()))
    arrays.append(seqs.take(row_msg))
    arrays.append(records.column("topic").combine_chunks().take(record_index))
    arrays.append(records.column("partition").combine_chunks().take(record_index))
    arrays.append(records.column("offset").combine_chunks().take(record_index))
    arrays.append(source_ts.take(row_msg))
    arrays.append(_field(source, "db").cast(pa.string()).take(row_msg))
    arrays.append(_field(source, "table").cast(pa.string()).take(row_msg))
    fields.extend(METADATA_FIELDS)
    rows = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    tombstones = records.num_rows - n
    skipped = {"tombstone": tombstones} if tombstones else {}
    found = _positions(source, records, idx, _field(source, "ts_ms"))
    return DecodeResult(rows=rows, dead_letters=DEAD_LETTER_SCHEMA.empty_table(), skipped=skipped,
                        positions=found)


def _field(struct: pa.StructArray, name: str) -> pa.Array:
    """A child of a struct array, or nulls when the schema has no such field."""
    if not pat.is_struct(struct.type) or struct.type.get_field_index(name) == -1:
        return pa.nulls(len(struct))
    return struct.field(name)


def _finish_column(spec: ColumnSpec, column: pa.Array) -> pa.Array | None:
    """The column in its declared type; None when that takes a per-value conversion."""
    t = spec.type
    column = _convert_column(spec, column)
    if column is not None and pat.is_temporal(t) and outside(column, t) is not None:
        return None   # a date or time no engine can read back: the per-message path explains it
    return column


def _convert_column(spec: ColumnSpec, column: pa.Array) -> pa.Array | None:
    t = spec.type
    src = column.type
    try:
        if pat.is_null(src):
            return pa.nulls(len(column), type=t)
        if pat.is_integer(src) and (pat.is_timestamp(t) or pat.is_time(t) or pat.is_duration(t)):
            return _rescale(column, spec.unit or "ms", t.unit).cast(t)
        if pat.is_integer(src) and pat.is_date32(t):
            if (spec.unit or "d") != "d":
                return None
            return column.cast(pa.int32(), safe=True).cast(t)
        if src == t:
            return column
        if pat.is_floating(t) and (pat.is_integer(src) or pat.is_floating(src)):
            return to_float(column, t)
        if _same_kind(src, t):
            return column.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return None


def _same_kind(src: pa.DataType, dst: pa.DataType) -> bool:
    kinds = (pat.is_integer, pat.is_floating, pat.is_decimal, pat.is_date, pat.is_boolean)
    if (pat.is_string(src) or pat.is_large_string(src)) and (pat.is_string(dst) or pat.is_decimal(dst)):
        return True
    if (pat.is_binary(src) or pat.is_large_binary(src)) and pat.is_binary(dst):
        return True
    if pat.is_timestamp(src) and pat.is_timestamp(dst):
        return True
    if pat.is_time(src) and pat.is_time(dst):
        return True
    if pat.is_integer(src) and pat.is_floating(dst):
        return True
    return any(k(src) and k(dst) for k in kinds)


def _to_ms(ints: pa.Array) -> pa.Array | None:
    """Epoch milliseconds as a timestamp; None when one is outside the SQL range (per-message path)."""
    ts = ints.cast(pa.int64()).cast(METADATA_FIELDS[5].type)
    return None if outside(ts, ts.type) is not None else ts


def _meta(key: str, body: pa.StructArray, source: pa.StructArray) -> pa.Array:
    if key == "ingestion-timestamp":
        return _field(body, "ts_ms")
    return _field(source, {"source.timestamp": "ts_ms", "source.database": "db", "source.schema": "schema",
                           "source.table": "table"}[key])


def _sequences(source: pa.StructArray, partitions: pa.Array, offsets: pa.Array) -> pa.Array:
    """Per-message ``_seq``, the same text as :func:`changelake.formats.debezium.sequence`, built
    column-wise: binlog (file index, pos, row) where there is one, else the LSN, else Kafka."""
    files = _field(source, "file").cast(pa.string())
    pos = _field(source, "pos").cast(pa.int64())
    row = _field(source, "row").cast(pa.int64())
    lsn = _field(source, "lsn").cast(pa.int64())
    suffix = _file_index(files)
    if (pc.max(pc.utf8_length(suffix)).as_py() or 0) > _WIDTH:
        return None
    binlog = pc.and_kleene(pc.is_valid(suffix), pc.greater_equal(pos, 0))
    off = _pad(offsets)
    seq_binlog = pc.binary_join_element_wise(
        "l", _pad(pc.utf8_ltrim(suffix, "0")), _pad(pos),
        _pad(pc.if_else(pc.fill_null(pc.greater_equal(row, 0), False), row, 0)), off, "")
    seq_lsn = pc.binary_join_element_wise("l", _pad(lsn), off, "")
    seq_kafka = pc.binary_join_element_wise("k", _pad(partitions, 5), off, "")
    use_lsn = pc.fill_null(pc.greater_equal(lsn, 0), False)
    return pc.if_else(pc.fill_null(binlog, False), seq_binlog, pc.if_else(use_lsn, seq_lsn, seq_kafka))


def _file_index(files: pa.Array) -> pa.Array:
    """The digits after the last dot of each binlog file name (``mysql-bin.000042``: ``000042``), else null.
    A chunk names a few files, so the pattern runs once per distinct name (~10x fewer calls)."""
    names = pc.dictionary_encode(files)
    return pc.struct_field(pc.extract_regex(names.dictionary, r"\.(?P<n>[0-9]+)$"), "n").take(names.indices)


def _positions(source: pa.StructArray, records: pa.Table, idx: np.ndarray, ts: pa.Array) -> pa.Table:
    """The messages' log positions for the epoch rule, column-wise: the same as
    :func:`changelake.formats.debezium.log_position` (a differential test holds them equal)."""
    files = _field(source, "file").cast(pa.string())
    pos = _field(source, "pos").cast(pa.int64())
    lsn = _field(source, "lsn").cast(pa.int64())
    suffix = _file_index(files).cast(pa.int64())
    binlog = pc.fill_null(pc.and_kleene(pc.is_valid(suffix), pc.greater_equal(pos, 0)), False)
    use_lsn = pc.and_(pc.invert(binlog), pc.fill_null(pc.greater_equal(lsn, 0), False))
    keep = pc.or_(binlog, use_lsn)
    if not pc.any(keep).as_py():
        return POSITIONS_SCHEMA.empty_table()
    server = _field(source, "server_id").cast(pa.int64())
    uuid = pc.struct_field(pc.extract_regex(_field(source, "gtid").cast(pa.string()), r"^(?P<u>[^:]+):"), "u")
    marker = pc.if_else(pc.fill_null(pc.greater(server, 0), False),
                        pc.binary_join_element_wise("server_id ", server.cast(pa.string()), ""),
                        pc.binary_join_element_wise("server_uuid ", uuid, ""))
    committed = pc.struct_field(pc.extract_regex(_field(source, "sequence").cast(pa.string()),
                                                 r'^\[\s*"?(?P<c>[0-9]+)'), "c").cast(pa.int64())
    order = pc.if_else(binlog, pc.add(pc.shift_left(suffix, 32), pos), pc.coalesce(committed, lsn))
    marker = pc.if_else(binlog, marker, pa.nulls(len(marker), pa.string()))
    where = records.select(["topic", "partition", "offset"]).take(pa.array(idx))
    table = pa.Table.from_arrays([*(where.column(c).combine_chunks() for c in ("topic", "partition", "offset")),
                                  marker, order, ts.cast(pa.int64())], schema=POSITIONS_SCHEMA)
    return table.filter(keep)


_WIDTH = 20


def _pad(values: pa.Array, width: int = _WIDTH) -> pa.Array:
    return pc.utf8_lpad(values.cast(pa.string()), width, "0")
