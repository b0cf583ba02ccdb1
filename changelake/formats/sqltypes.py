"""Flink SQL type names -> Arrow types, for declaring a decoder's ``columns``.

Only the types a CDC table needs are accepted; anything else is a
:class:`~changelake.errors.ConfigError` that lists what is supported.

>>> sql_type("DECIMAL(10, 2) NOT NULL")
Decimal128Type(decimal128(10, 2))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import pyarrow as pa

from changelake.errors import ConfigError

_SIMPLE: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "BYTES": pa.binary(),
    "DATE": pa.date32(),
}

_TYPE_RE = re.compile(r"^\s*([A-Z_ ]+?)\s*(?:\(\s*([0-9 ,]+)\s*\))?\s*(NOT NULL|NULL)?\s*$", re.IGNORECASE)


def _precision_to_unit(precision: int) -> str:
    if precision <= 0:
        return "s"
    if precision <= 3:
        return "ms"
    if precision <= 6:
        return "us"
    return "ns"


def sql_type(text: str) -> pa.DataType:
    """The Arrow type for a Flink SQL type name (``NOT NULL`` is accepted and ignored here)."""
    inner = text.strip()
    upper = inner.upper()
    if upper.startswith("ARRAY<") and upper.rstrip().removesuffix("NOT NULL").rstrip().endswith(">"):
        body = inner[inner.index("<") + 1: inner.rindex(">")]
        return pa.list_(sql_type(body))
    if upper.startswith("MAP<") and upper.rstrip().removesuffix("NOT NULL").rstrip().endswith(">"):
        body = inner[inner.index("<") + 1: inner.rindex(">")]
        key, value = _split_top_level(body)
        return pa.map_(sql_type(key), sql_type(value))
    match = _TYPE_RE.match(inner)
    if not match:
        raise ConfigError(f"unsupported column type {text!r}; {_SUPPORTED}")
    name = " ".join(match.group(1).upper().split())
    args = [int(a) for a in match.group(2).split(",")] if match.group(2) else []
    if name in _SIMPLE and not args:
        return _SIMPLE[name]
    if name in ("VARCHAR", "CHAR"):
        return pa.string()
    if name in ("VARBINARY", "BINARY"):
        return pa.binary()
    if name in ("DECIMAL", "NUMERIC", "DEC"):
        precision = args[0] if args else 10
        scale = args[1] if len(args) > 1 else 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise ConfigError(f"unsupported column type {text!r}: DECIMAL precision must be 1..38 and 0 <= scale <= precision")
        return pa.decimal128(precision, scale)
    if name in ("TIMESTAMP", "TIMESTAMP WITHOUT TIME ZONE"):
        return pa.timestamp(_precision_to_unit(args[0] if args else 6))
    if name in ("TIMESTAMP_LTZ", "TIMESTAMP WITH LOCAL TIME ZONE"):
        return pa.timestamp(_precision_to_unit(args[0] if args else 6), tz="UTC")
    if name in ("TIME", "TIME WITHOUT TIME ZONE"):
        precision = args[0] if args else 0
        unit = _precision_to_unit(precision)
        return pa.time32("s" if unit == "s" else "ms") if unit in ("s", "ms") else pa.time64(unit)
    raise ConfigError(f"unsupported column type {text!r}; {_SUPPORTED}")


_SUPPORTED = ("supported: BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL(p, s), STRING, "
              "VARCHAR(n), CHAR(n), BYTES, BINARY(n), VARBINARY(n), DATE, TIME(p), TIMESTAMP(p), "
              "TIMESTAMP_LTZ(p), ARRAY<t>, MAP<k, v>")


def _split_top_level(body: str) -> tuple[str, str]:
    depth = 0
    for i, ch in enumerate(body):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            return body[:i], body[i + 1:]
    raise ConfigError(f"MAP type needs a key and a value type, got MAP<{body}>")


def sql_schema(columns: Iterable[Sequence[str]]) -> pa.Schema:
    """An Arrow schema from ``[(name, sql type), ...]``; ``NOT NULL`` makes the field non-nullable.
    A third element declares the column's wire encoding (:mod:`changelake.formats.encodings`), e.g.
    ``("created", "TIMESTAMP(6)", "io.debezium.time.MicroTimestamp")``."""
    from changelake.formats.encodings import encoded

    fields = []
    for name, type_text, *encoding in columns:
        nullable = not type_text.strip().upper().endswith("NOT NULL")
        field = pa.field(name, sql_type(type_text), nullable=nullable)
        if encoding and encoding[0] is not None:
            field = encoded(field, encoding[0])
        fields.append(field)
    return pa.schema(fields)
