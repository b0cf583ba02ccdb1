"""Declared wire encodings: how a column's value travels when no schema travels with it.

With the Debezium JSON envelope or Avro, the message's schema says how a value is
encoded (``io.debezium.time.MicroTimestamp`` is an integer of microseconds, a
Connect ``Decimal`` is base64 of an unscaled integer, ...). Without one
(``schemas.enable=false``, Canal, Maxwell, OGG) the decoder has to be told, or it
reads integers for timestamps as milliseconds. A declared column can say so::

    columns:
      created: {type: timestamp_ntz, encoding: io.debezium.time.MicroTimestamp}
      price:   {type: "decimal(10,2)", encoding: org.apache.kafka.connect.data.Decimal}

A declared encoding is a contract: a value that is not encoded that way (text
where an integer is declared, an integer out of the type's range, a date beyond
9999-12-31) is a ``schema-mismatch`` dead letter naming the column. Where a message
does carry a schema for the column, the schema wins.

The encoding travels to the decoder as metadata of the column's Arrow field
(:func:`encoded`), so ``make_decoder(columns=schema)`` stays the one way to declare
columns.

==========================================  ===============  =================================================
encoding                                    for types        the value on the wire
==========================================  ===============  =================================================
``io.debezium.time.Date``                   DATE             integer: days since 1970-01-01
``org.apache.kafka.connect.data.Date``      DATE             same
``epoch-days``                              DATE             same
``io.debezium.time.Time``                   TIME             integer: milliseconds since midnight
``org.apache.kafka.connect.data.Time``      TIME             same
``io.debezium.time.MicroTime``              TIME             integer: microseconds since midnight
``io.debezium.time.NanoTime``               TIME             integer: nanoseconds since midnight
``io.debezium.time.Timestamp``              TIMESTAMP(_LTZ)  integer: milliseconds since the epoch
``org.apache.kafka.connect.data.Timestamp`` TIMESTAMP(_LTZ)  same
``io.debezium.time.MicroTimestamp``         TIMESTAMP(_LTZ)  integer: microseconds since the epoch
``io.debezium.time.NanoTimestamp``          TIMESTAMP(_LTZ)  integer: nanoseconds since the epoch
``epoch-seconds`` / ``-millis`` /           TIMESTAMP(_LTZ)  integer: seconds / ms / µs / ns since the epoch
``-micros`` / ``-nanos``
``io.debezium.time.ZonedTimestamp``         TIMESTAMP(_LTZ)  ISO-8601 text with a UTC offset or ``Z``
``iso-8601``                                DATE, TIME,      ISO-8601 text; a TIMESTAMP_LTZ without offset
                                            TIMESTAMP(_LTZ)  is read as UTC
``org.apache.kafka.connect.data.Decimal``   DECIMAL          base64 of the big-endian two's-complement
                                                             unscaled integer (``decimal.handling.mode=
                                                             precise``); ``scale`` defaults to the type's
``decimal-base64``                          DECIMAL          same
``decimal-string``                          DECIMAL          text (``decimal.handling.mode=string``)
``io.debezium.data.VariableScaleDecimal``   DECIMAL, STRING  ``{"scale": s, "value": base64}``
``base64``                                  BYTES            base64 text (Debezium's default)
``base64-url-safe``                         BYTES            URL-safe base64 text
``hex``                                     BYTES            hexadecimal text
``iso-8859-1``                              BYTES            one character per byte (Canal's default)
==========================================  ===============  =================================================

An integer encoding also accepts a string of digits (Canal sends every value as text).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.types as pat

from changelake.errors import ConfigError
from changelake.formats.assemble import ColumnSpec
from changelake.types import arrow_schema, arrow_type

#: Arrow field metadata keys that carry a declared encoding
ENCODING_KEY = b"changelake.encoding"
SCALE_KEY = b"changelake.encoding.scale"


@dataclass(frozen=True)
class Encoding:
    """How the values of one column are written on the wire.

    ``wire``: ``int`` (an integer in ``unit``), ``iso`` (ISO-8601 text), ``zoned`` (ISO-8601 text
    with an offset), ``decimal-bytes``, ``decimal-text``, ``variable-decimal``, ``base64``,
    ``base64-url-safe`` or ``hex``. ``types``: the kinds of declared type it applies to.
    """

    name: str
    wire: str
    types: tuple[str, ...]
    unit: str | None = None
    scale: int | None = None


_DATE, _TIME, _TIMESTAMP, _DECIMAL, _STRING, _BYTES = "DATE", "TIME", "TIMESTAMP", "DECIMAL", "STRING", "BYTES"

ENCODINGS: dict[str, Encoding] = {e.name: e for e in (
    Encoding("io.debezium.time.Date", "int", (_DATE,), "d"),
    Encoding("org.apache.kafka.connect.data.Date", "int", (_DATE,), "d"),
    Encoding("epoch-days", "int", (_DATE,), "d"),
    Encoding("io.debezium.time.Time", "int", (_TIME,), "ms"),
    Encoding("org.apache.kafka.connect.data.Time", "int", (_TIME,), "ms"),
    Encoding("io.debezium.time.MicroTime", "int", (_TIME,), "us"),
    Encoding("io.debezium.time.NanoTime", "int", (_TIME,), "ns"),
    Encoding("io.debezium.time.Timestamp", "int", (_TIMESTAMP,), "ms"),
    Encoding("org.apache.kafka.connect.data.Timestamp", "int", (_TIMESTAMP,), "ms"),
    Encoding("io.debezium.time.MicroTimestamp", "int", (_TIMESTAMP,), "us"),
    Encoding("io.debezium.time.NanoTimestamp", "int", (_TIMESTAMP,), "ns"),
    Encoding("epoch-seconds", "int", (_TIMESTAMP,), "s"),
    Encoding("epoch-millis", "int", (_TIMESTAMP,), "ms"),
    Encoding("epoch-micros", "int", (_TIMESTAMP,), "us"),
    Encoding("epoch-nanos", "int", (_TIMESTAMP,), "ns"),
    Encoding("io.debezium.time.ZonedTimestamp", "zoned", (_TIMESTAMP,)),
    Encoding("iso-8601", "iso", (_DATE, _TIME, _TIMESTAMP)),
    Encoding("org.apache.kafka.connect.data.Decimal", "decimal-bytes", (_DECIMAL,)),
    Encoding("decimal-base64", "decimal-bytes", (_DECIMAL,)),
    Encoding("decimal-string", "decimal-text", (_DECIMAL,)),
    Encoding("io.debezium.data.VariableScaleDecimal", "variable-decimal", (_DECIMAL, _STRING)),
    Encoding("base64", "base64", (_BYTES,)),
    Encoding("base64-url-safe", "base64-url-safe", (_BYTES,)),
    Encoding("hex", "hex", (_BYTES,)),
    Encoding("iso-8859-1", "latin-1", (_BYTES,)),
)}


def _kind(t: pa.DataType) -> str | None:
    if pat.is_date32(t):
        return _DATE
    if pat.is_time(t):
        return _TIME
    if pat.is_timestamp(t):
        return _TIMESTAMP
    if pat.is_decimal(t):
        return _DECIMAL
    if pat.is_string(t) or pat.is_large_string(t):
        return _STRING
    if pat.is_binary(t) or pat.is_large_binary(t) or pat.is_fixed_size_binary(t):
        return _BYTES
    return None


def _accepted(kind: str | None, arrow_type: pa.DataType) -> str:
    if kind is None:
        return f"a column of type {arrow_type} takes no encoding (only DATE, TIME, TIMESTAMP, DECIMAL, STRING " \
               f"and BYTES columns do)"
    return f"a {kind} column accepts: {', '.join(n for n, e in ENCODINGS.items() if kind in e.types)}"


def encoding_of(name: str, arrow_type: pa.DataType, *, scale: Any = None, column: str = "?") -> Encoding:
    """The validated encoding ``name`` for a column of ``arrow_type`` (:class:`ConfigError` otherwise)."""
    enc = ENCODINGS.get(str(name).strip())
    kind = _kind(arrow_type)
    if enc is None:
        raise ConfigError(f"column {column!r}: unknown encoding {name!r}; {_accepted(kind, arrow_type)} "
                          f"(docs/formats.md, 'Wire encodings')")
    if kind not in enc.types:
        raise ConfigError(f"column {column!r}: encoding {enc.name!r} is for {' or '.join(enc.types)} columns; "
                          f"{_accepted(kind, arrow_type)}")
    if scale is not None and enc.wire != "decimal-bytes":
        raise ConfigError(f"column {column!r}: 'scale' only goes with a decimal bytes encoding "
                          f"(org.apache.kafka.connect.data.Decimal, decimal-base64), not {enc.name!r}")
    if enc.wire == "decimal-bytes":
        if scale is None:
            scale = arrow_type.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, str)) or not str(scale).strip().isdigit():
            raise ConfigError(f"column {column!r}: 'scale' must be a whole number >= 0, got {scale!r}")
        return Encoding(enc.name, enc.wire, enc.types, scale=int(scale))
    return enc


def encoded(field: pa.Field, encoding: str, *, scale: int | None = None) -> pa.Field:
    """``field`` carrying a declared wire encoding (validated against its type)."""
    enc = encoding_of(encoding, field.type, scale=scale, column=field.name)
    meta = dict(field.metadata or {})
    meta[ENCODING_KEY] = enc.name.encode()
    if enc.scale is not None:
        meta[SCALE_KEY] = str(enc.scale).encode()
    return field.with_metadata(meta)


def field_encoding(field: pa.Field) -> Encoding | None:
    """The encoding declared on a field (:func:`encoded`), or None."""
    meta = field.metadata or {}
    name = meta.get(ENCODING_KEY)
    if name is None:
        return None
    scale = meta.get(SCALE_KEY)
    return encoding_of(name.decode(), field.type, scale=None if scale is None else scale.decode(), column=field.name)


def column_spec(field: pa.Field) -> ColumnSpec:
    """How a decoder reads a declared column: its type, and its encoding if one is declared."""
    enc = field_encoding(field)
    if enc is None:
        return ColumnSpec(field.name, field.type, field.nullable)
    return ColumnSpec(field.name, field.type, field.nullable, unit=enc.unit, decimal_scale=enc.scale, wire=enc.wire)


_DECLARATION_KEYS = ("type", "encoding", "scale")


def declared_field(name: str, declaration: Any, arrow_type: Any) -> pa.Field:
    """The field of one entry of a source's ``columns``: a type text, or a mapping
    ``{type: ..., encoding: ..., scale: ...}``. ``arrow_type`` maps a type text to Arrow."""
    if isinstance(declaration, str):
        return pa.field(name, arrow_type(declaration))
    if not isinstance(declaration, Mapping):
        raise ConfigError(f"column {name!r}: expected a type (e.g. bigint) or a mapping {{type: ..., encoding: ...}}, "
                          f"got {declaration!r}")
    unknown = [k for k in declaration if k not in _DECLARATION_KEYS]
    if unknown:
        raise ConfigError(f"column {name!r}: unknown key(s) {unknown}; a column takes {', '.join(_DECLARATION_KEYS)}")
    if not isinstance(declaration.get("type"), str):
        raise ConfigError(f"column {name!r}: 'type' is required (e.g. {{type: timestamp, encoding: "
                          f"io.debezium.time.MicroTimestamp}})")
    field = pa.field(name, arrow_type(declaration["type"]))
    if declaration.get("encoding") is None:
        if declaration.get("scale") is not None:
            raise ConfigError(f"column {name!r}: 'scale' needs an encoding (org.apache.kafka.connect.data.Decimal "
                              f"or decimal-base64)")
        return field
    return encoded(field, declaration["encoding"], scale=declaration.get("scale"))


def source_schema(columns: Mapping[str, Any]) -> pa.Schema:
    """A source's declared columns: name -> type text, or name -> ``{type, encoding, scale}`` (the
    declared wire encoding travels as field metadata)."""
    fields = []
    for name, t in columns.items():
        if isinstance(t, str):
            fields.append(arrow_schema({name: t}).field(0))
        else:
            dump = getattr(t, "model_dump", None)      # a pydantic model of the config, or already a mapping
            fields.append(declared_field(name, dump(exclude_none=True) if dump is not None else t, arrow_type))
    return pa.schema(fields)
