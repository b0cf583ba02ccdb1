"""Column types as users write them in the pipeline YAML, mapped to Arrow."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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


def arrow_schema(columns: Mapping[str, Any]) -> pa.Schema:
    """Declared columns: name -> type text, or name -> ``{type, encoding, scale}`` (a declared wire
    encoding, carried as field metadata: :mod:`changelake.formats.encodings`)."""
    fields = []
    for name, t in columns.items():
        if isinstance(t, str):
            try:
                fields.append(pa.field(name, arrow_type(t)))
            except ConfigError as exc:
                raise ConfigError(f"column {name!r}: {exc}") from None
        else:
            from changelake.formats.encodings import declared_field  # only sources declare encodings
            fields.append(declared_field(name, _plain(t), arrow_type))
    return pa.schema(fields)


def _plain(declaration: Any) -> Any:
    """A column declaration as a mapping (a pydantic model of the config, or already one)."""
    dump = getattr(declaration, "model_dump", None)
    return dump(exclude_none=True) if dump is not None else declaration
