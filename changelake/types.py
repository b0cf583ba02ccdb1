"""Column types as users write them in the pipeline YAML, mapped to Arrow."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import pyarrow as pa

from changelake.errors import ConfigError

_SIMPLE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "integer": pa.int32(),
    "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "real": pa.float32(), "double": pa.float64(),
    "string": pa.string(), "varchar": pa.string(), "text": pa.string(),
    "binary": pa.binary(), "bytes": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"^decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_VARCHAR = re.compile(r"^(var)?char\s*\(\s*\d+\s*\)$")


def arrow_type(text: str) -> pa.DataType:
    """'bigint' -> int64, 'decimal(10,2)' -> decimal128(10, 2), ..."""
    t = text.strip().lower()
    if t in _SIMPLE:
        return _SIMPLE[t]
    m = _DECIMAL.match(t)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise ConfigError(f"decimal({precision},{scale}): precision must be 1..38 and scale <= precision")
        return pa.decimal128(precision, scale)
    if _VARCHAR.match(t):
        return pa.string()
    raise ConfigError(f"unknown column type {text!r}; use one of {sorted(_SIMPLE)} or decimal(p,s)")


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """Columns as name -> type text. (A source's columns may also declare a wire encoding:
    :func:`changelake.formats.encodings.source_schema` reads those.)"""
    fields = []
    for name, t in columns.items():
        if not isinstance(t, str):
            raise ConfigError(f"column {name!r}: only a source's columns declare an encoding; write the type "
                              f"alone here, e.g. {name}: bigint")
        try:
            fields.append(pa.field(name, arrow_type(t)))
        except ConfigError as exc:
            raise ConfigError(f"column {name!r}: {exc}") from None
    return pa.schema(fields)


_INT_WIDENING = {"byte": 0, "short": 1, "integer": 2, "long": 3}
_FLOAT_WIDENING = {"float": 0, "double": 1}


def delta_type(field: pa.Field) -> str:
    """Delta type of an Arrow field: the primitive name (``long``) or the JSON of a nested type."""
    from deltalake import Schema as DeltaSchema

    text = DeltaSchema.from_arrow(pa.schema([field])).fields[0].type.to_json()
    decoded = json.loads(text)
    return decoded if isinstance(decoded, str) else text


def _widens(src: str, dst: str) -> bool:
    for ladder in (_INT_WIDENING, _FLOAT_WIDENING):
        if src in ladder and dst in ladder:
            return ladder[src] <= ladder[dst]
    return False


def fits(field: pa.Field, existing: pa.Field) -> bool:
    """True when values of ``field`` can be written into a column of ``existing``'s type (same Delta
    type, or a narrower integer / floating-point type)."""
    got, have = delta_type(field), delta_type(existing)
    return got == have or _widens(got, have)


def type_change(old: pa.DataType, new: pa.DataType) -> str:
    """How a column's type moved from ``old`` to ``new``, in Delta's terms:

    ``same`` (the same Delta type: a longer VARCHAR, another timestamp unit), ``widen`` (every old
    value fits the new type: byte < short < int < long, float < double, DECIMAL(p, s) to a DECIMAL
    with at least s fraction digits and p - s integer digits), ``narrow`` (the reverse) or
    ``incompatible`` (anything else: string <-> int, int -> double, decimal scale down, ...).
    """
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        if (old.precision, old.scale) == (new.precision, new.scale):
            return "same"
        digits = (new.scale - old.scale, (new.precision - new.scale) - (old.precision - old.scale))
        if min(digits) >= 0:
            return "widen"
        return "narrow" if max(digits) <= 0 else "incompatible"
    got, have = delta_type(pa.field("c", new)), delta_type(pa.field("c", old))
    if got == have:
        return "same"
    if _widens(have, got):
        return "widen"
    return "narrow" if _widens(got, have) else "incompatible"
