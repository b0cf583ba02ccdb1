"""What Debezium JSON and Debezium Avro share: op rules, ordering token, the
Kafka Connect schema -> Arrow type mapping, and the readable metadata keys.

Op rules (Flink's, plus the two Debezium ops Flink rejects)::

    op      before   after    emits
    c, r    -        row      +I(after)
    u       row      row      -U(before), +U(after)
    u       null     row      upsert: +U(after)     else dead letter missing-before
    d       row      -        -D(before)
    d       null     -        dead letter missing-before
    t       -        -        on_truncate apply or skip: a truncate at the event's position (the pipeline
                              applies or counts it)          fail: dead letter unsupported
    m       -        -        nothing, counted (logical decoding message)
    other                     dead letter unknown-op
"""

from __future__ import annotations

import base64
import decimal
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa

from changelake.changelog import RowKind, seq_from_kafka, seq_from_log_position
from changelake.formats.assemble import ChangeCollector, ColumnSpec, MetaColumn, Reject
from changelake.formats.convert import unscaled_decimal
from changelake.formats.options import Option
from changelake.formats.sequence import binlog_order, mysql_marker

INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = (int(k) for k in RowKind)

#: what a source does with a TRUNCATE (``on_truncate``)
TRUNCATE_POLICIES = ("apply", "skip", "fail")

REPLICA_IDENTITY_HINT = ("if this is Postgres, set REPLICA IDENTITY FULL on the table, or declare the source as "
                         "upsert (option upsert: true)")


def debezium_options() -> list[Option]:
    return [
        Option("upsert", "bool", False,
               doc="the source is an upsert stream: an update without a before-image emits only +U"),
        Option("on-truncate", "choice", "skip", TRUNCATE_POLICIES,
               doc="op 't': apply (empty the table at the truncate's position), skip (counted) or fail (dead "
                   "letter 'unsupported' naming the position)"),
    ]


def changes(op: Any, before: Any, after: Any, *, upsert: bool) -> list[tuple[int, dict]] | str:
    """The (kind, image) pairs of one Debezium change, or the name of a counted skip (op t is the caller's)."""
    if op == "c" or op == "r":
        if not isinstance(after, dict):
            raise Reject("malformed", f"op {op!r} without an 'after' row; the message is not a Debezium "
                                      f"change event (check the connector's converter settings)")
        return [(INSERT, after)]
    if op == "u":
        if not isinstance(after, dict):
            raise Reject("malformed", "op 'u' without an 'after' row; check the connector's converter settings")
        if not isinstance(before, dict):
            if upsert:
                return [(UPDATE_AFTER, after)]
            raise Reject("missing-before", "the 'before' row of an UPDATE is null, so the old row cannot be "
                                           f"retracted; {REPLICA_IDENTITY_HINT}")
        return [(UPDATE_BEFORE, before), (UPDATE_AFTER, after)]
    if op == "d":
        if not isinstance(before, dict):
            raise Reject("missing-before", "the 'before' row of a DELETE is null, so the deleted key is unknown; "
                                           f"{REPLICA_IDENTITY_HINT}")
        return [(DELETE, before)]
    if op == "m":
        return "message"
    raise Reject("unknown-op", f"unknown op {op!r}; Debezium change events have op c, r, u, d, t or m")


def collect_event(out: ChangeCollector, record: int, payload: dict, *, schema: Any, meta: Sequence[MetaColumn],
                  partition: int, offset: int, upsert: bool, on_truncate: str) -> str | None:
    """Register one Debezium change event (JSON payload or Avro record) with the collector.

    Returns the name of a counted skip, or None; raises :class:`Reject` for a bad event.
    """
    op = payload.get("op")
    source = payload.get("source")
    if isinstance(source, dict):
        ts, db, table = source.get("ts_ms"), source.get("db"), source.get("table")
    else:
        ts = db = table = None
    if op == "t":
        truncate(out, record, sequence(source, partition, offset), db, table, on_truncate=on_truncate,
                 what="a TRUNCATE event (op 't')")
        log_position(out, record, source)
        return None
    got = changes(op, payload.get("before"), payload.get("after"), upsert=upsert)
    if isinstance(got, str):
        return got
    log_position(out, record, source)
    values = [metadata_value(m.key, payload, source, schema) for m in meta] if meta else ()
    msg = out.message(record, sequence(source, partition, offset), ts if type(ts) is int else None,
                      db if isinstance(db, str) else None, table if isinstance(table, str) else None, values)
    for kind, image in got:
        out.row(msg, kind, image)
    return None


def truncate(out: ChangeCollector, record: int, seq: str, db: Any, table: Any, *, on_truncate: str,
             what: str) -> None:
    """A TRUNCATE message at ``seq``: registered with the collector (apply, skip), or a dead letter (fail)
    that names its position. Shared by every format that carries truncates."""
    if on_truncate != "fail":
        out.truncate(record, seq, db, table)
        return
    name = ".".join(n for n in (db, table) if isinstance(n, str)) or "the table"
    raise Reject("unsupported", f"{what} of {name} at position {seq} and on_truncate is 'fail'; empty the target "
                                "table up to that position by hand, then set on_truncate: apply (the sink empties "
                                "it) or skip (ignore truncates) and replay this dead letter")


def sequence(source: Any, partition: int, offset: int) -> str:
    """MySQL binlog (file index, pos, row), Postgres LSN, else the Kafka position.

    Same text as :func:`changelake.changelog.seq_from_log_position` /
    :func:`~changelake.changelog.seq_from_kafka` (a test holds them equal); formatted
    inline because it runs once per message.
    """
    if type(source) is dict:
        file = source.get("file")
        pos = source.get("pos")
        if type(file) is str and type(pos) is int and pos >= 0:
            suffix = file[file.rfind(".") + 1:]
            if suffix.isdigit():
                row = source.get("row")
                if type(row) is not int or row < 0:
                    row = 0
                return f"l{int(suffix):020d}{pos:020d}{row:020d}{offset:020d}"
        lsn = source.get("lsn")
        if type(lsn) is int and lsn >= 0:
            return seq_from_log_position(lsn, offset=offset)
    return seq_from_kafka(partition, offset)


def log_position(out: ChangeCollector, record: int, source: Any) -> None:
    """Register the message's log position for the epoch rule (``changelake.formats.sequence``): MySQL's
    server (``server_id``, else the GTID's server UUID) and binlog order; PostgreSQL's last commit LSN
    (``sequence``), else its LSN. Nothing for a message without a position."""
    if type(source) is not dict:
        return
    ts = source.get("ts_ms")
    ts = ts if type(ts) is int else None
    file, pos = source.get("file"), source.get("pos")
    if type(file) is str and type(pos) is int and pos >= 0:
        suffix = file[file.rfind(".") + 1:]
        if suffix.isdigit():
            out.position(record, mysql_marker(source.get("server_id"), source.get("gtid")),
                         binlog_order(int(suffix), pos), ts)
        return
    lsn = source.get("lsn")
    if type(lsn) is int and lsn >= 0:
        out.position(record, None, commit_lsn(source.get("sequence"), lsn), ts)


def commit_lsn(sequence_field: Any, lsn: int) -> int:
    """The last commit LSN from Debezium PostgreSQL's ``sequence`` (``["<last commit lsn>", "<lsn>"]``): it
    grows along the log in commit order, where a change's own LSN does not (interleaved transactions)."""
    if isinstance(sequence_field, str) and sequence_field.startswith("["):
        try:
            first = orjson.loads(sequence_field)[0]
            return int(first) if first is not None else lsn
        except (ValueError, TypeError, IndexError):
            return lsn
    return lsn


# --- readable metadata (Flink's keys) --------------------------------------------------

METADATA_TYPES: dict[str, pa.DataType] = {
    "schema": pa.string(),
    "ingestion-timestamp": pa.timestamp("ms", tz="UTC"),
    "source.timestamp": pa.timestamp("ms", tz="UTC"),
    "source.database": pa.string(),
    "source.schema": pa.string(),
    "source.table": pa.string(),
    "source.properties": pa.map_(pa.string(), pa.string()),
}


def metadata_value(key: str, payload: dict, source: Any, schema: Any) -> Any:
    if key == "ingestion-timestamp":
        return payload.get("ts_ms")
    if key == "schema":
        return None if schema is None else orjson.dumps(schema).decode()
    if not isinstance(source, dict):
        return None
    if key == "source.timestamp":
        return source.get("ts_ms")
    if key == "source.database":
        return source.get("db")
    if key == "source.schema":
        return source.get("schema")
    if key == "source.table":
        return source.get("table")
    if key == "source.properties":
        return [(k, _as_text(v)) for k, v in source.items()]
    raise KeyError(key)


def _as_text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return orjson.dumps(v).decode()


# --- Kafka Connect schema -> Arrow ------------------------------------------------------

_PLAIN = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
          "float32": pa.float32(), "float64": pa.float64(), "float": pa.float32(), "double": pa.float64(),
          "boolean": pa.bool_(), "string": pa.string(), "bytes": pa.binary()}

#: semantic type name -> (Arrow type, unit of the integer encoding)
_TEMPORAL = {
    "io.debezium.time.Date": (pa.date32(), "d"),
    "org.apache.kafka.connect.data.Date": (pa.date32(), "d"),
    "io.debezium.time.Time": (pa.time32("ms"), "ms"),
    "org.apache.kafka.connect.data.Time": (pa.time32("ms"), "ms"),
    "io.debezium.time.MicroTime": (pa.time64("us"), "us"),
    "io.debezium.time.NanoTime": (pa.time64("ns"), "ns"),
    "io.debezium.time.Timestamp": (pa.timestamp("ms"), "ms"),
    "org.apache.kafka.connect.data.Timestamp": (pa.timestamp("ms"), "ms"),
    "io.debezium.time.MicroTimestamp": (pa.timestamp("us"), "us"),
    "io.debezium.time.NanoTimestamp": (pa.timestamp("ns"), "ns"),
    "io.debezium.time.MicroDuration": (pa.duration("us"), "us"),
}

_TEXT_SEMANTICS = ("io.debezium.data.Json", "io.debezium.data.Uuid", "io.debezium.data.Enum",
                   "io.debezium.data.EnumSet", "io.debezium.data.Xml", "io.debezium.time.ZonedTime",
                   "io.debezium.time.Interval", "io.debezium.data.Ltree")


def variable_scale_decimal(v: Any) -> decimal.Decimal:
    """io.debezium.data.VariableScaleDecimal: ``{"scale": s, "value": <unscaled bytes>}``."""
    raw = v["value"]
    if isinstance(raw, str):
        raw = base64.b64decode(raw, validate=True)
    return unscaled_decimal(raw, int(v["scale"]))


def connect_column(name: str, field: dict) -> ColumnSpec:
    """The column for one field of a Connect ``struct`` schema (as in the JSON envelope)."""
    semantic = field.get("name")
    ftype = field.get("type")
    nullable = True
    params = field.get("parameters") or {}
    if semantic == "org.apache.kafka.connect.data.Decimal":
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", 38))
        precision = min(max(precision, scale, 1), 38)
        return ColumnSpec(name, pa.decimal128(precision, scale), nullable, decimal_scale=scale)
    if semantic == "io.debezium.data.VariableScaleDecimal":
        # no fixed scale: kept exact as decimal text (declare DECIMAL(p, s) in columns to get a number)
        return ColumnSpec(name, pa.string(), nullable, pre=variable_scale_decimal)
    if semantic in _TEMPORAL:
        arrow_type, unit = _TEMPORAL[semantic]
        return ColumnSpec(name, arrow_type, nullable, unit=unit)
    if semantic == "io.debezium.time.ZonedTimestamp":
        return ColumnSpec(name, pa.timestamp("us", tz="UTC"), nullable)
    if semantic == "io.debezium.data.Bits":
        return ColumnSpec(name, pa.binary(), nullable)
    if semantic in _TEXT_SEMANTICS:
        return ColumnSpec(name, pa.string(), nullable)
    if ftype in _PLAIN:
        return ColumnSpec(name, _PLAIN[ftype], nullable)
    if ftype == "array" and isinstance(field.get("items"), dict) and field["items"].get("type") in _PLAIN \
            and not field["items"].get("name"):
        return ColumnSpec(name, pa.list_(_PLAIN[field["items"]["type"]]), nullable)
    # structs (e.g. geometry), maps and anything unknown: compact JSON text
    return ColumnSpec(name, pa.string(), nullable)


def row_fields(envelope_schema: Any) -> list[dict] | None:
    """The row fields of a Debezium envelope schema (from its 'after', else 'before' struct)."""
    if not isinstance(envelope_schema, dict):
        return None
    fields = envelope_schema.get("fields")
    if not isinstance(fields, list):
        return None
    by_name = {f.get("field"): f for f in fields if isinstance(f, dict)}
    for side in ("after", "before"):
        struct = by_name.get(side)
        if isinstance(struct, dict) and isinstance(struct.get("fields"), list):
            return struct["fields"]
    return None


def with_source_encoding(declared: ColumnSpec, seen: ColumnSpec | None) -> ColumnSpec:
    """A declared column read with the encoding the Debezium schema reports for it."""
    if seen is None:
        return declared
    return ColumnSpec(declared.name, declared.type, declared.nullable, unit=seen.unit,
                      decimal_scale=seen.decimal_scale, pre=seen.pre)
