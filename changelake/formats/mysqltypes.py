"""MySQL column types as Canal reports them (``mysqlType`` text, ``sqlType`` JDBC codes)
-> Arrow types. Used when no ``columns`` are declared."""

from __future__ import annotations

import re

import pyarrow as pa

from changelake.formats.assemble import ColumnSpec

_TYPE_RE = re.compile(r"^\s*([a-z ]+?)\s*(?:\(([^)]*)\))?\s*(unsigned)?\s*(zerofill)?\s*$", re.IGNORECASE)

_INTS = {
    "tinyint": (pa.int8(), pa.int16()),
    "smallint": (pa.int16(), pa.int32()),
    "mediumint": (pa.int32(), pa.int32()),
    "int": (pa.int32(), pa.int64()),
    "integer": (pa.int32(), pa.int64()),
    "bigint": (pa.int64(), pa.decimal128(20, 0)),
}
_TEXT = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json")
_BINARY = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point")


def _unit(precision: int) -> str:
    return "s" if precision == 0 else "ms" if precision <= 3 else "us"


def from_mysql_type(text: str) -> pa.DataType | None:
    """Arrow type for a MySQL column type such as ``decimal(10,2)`` or ``int(11) unsigned``."""
    m = _TYPE_RE.match(text or "")
    if not m:
        return None
    name = m.group(1).lower().strip()
    args = [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
    unsigned = m.group(3) is not None
    if name in _INTS:
        return _INTS[name][1 if unsigned else 0]
    if name in ("float",):
        return pa.float32()
    if name in ("double", "double precision", "real"):
        return pa.float64()
    if name in ("decimal", "numeric", "dec", "fixed"):
        precision = int(args[0]) if args and args[0].isdigit() else 10
        scale = int(args[1]) if len(args) > 1 and args[1].isdigit() else 0
        return pa.decimal128(min(max(precision, 1), 38), min(scale, 38))
    if name in _TEXT:
        return pa.string()
    if name in _BINARY:
        return pa.binary()
    if name == "date":
        return pa.date32()
    if name in ("datetime", "timestamp"):
        return pa.timestamp(_unit(int(args[0]) if args and args[0].isdigit() else 0))
    if name == "time":
        precision = int(args[0]) if args and args[0].isdigit() else 0
        return pa.time32("s") if precision == 0 else pa.time64("us")
    if name == "year":
        return pa.int32()
    if name == "bit":
        return pa.bool_() if args in ([], ["1"]) else pa.int64()
    if name in ("bool", "boolean"):
        return pa.bool_()
    return None


#: java.sql.Types codes -> Arrow (when mysqlType is absent)
_JDBC = {
    -7: pa.bool_(), 16: pa.bool_(), -6: pa.int8(), 5: pa.int16(), 4: pa.int32(), -5: pa.int64(),
    6: pa.float64(), 7: pa.float32(), 8: pa.float64(), 2: pa.decimal128(38, 10), 3: pa.decimal128(38, 10),
    1: pa.string(), 12: pa.string(), -1: pa.string(), -15: pa.string(), -9: pa.string(), -16: pa.string(),
    2005: pa.string(), 91: pa.date32(), 92: pa.time32("s"), 93: pa.timestamp("s"),
    -2: pa.binary(), -3: pa.binary(), -4: pa.binary(), 2004: pa.binary(),
}


def canal_columns(mysql_type: object, sql_type: object) -> list[ColumnSpec] | None:
    """Columns of a Canal message from its ``mysqlType`` (preferred) or ``sqlType``; None if neither."""
    names: list[str] = []
    for source in (mysql_type, sql_type):
        if isinstance(source, dict):
            names.extend(n for n in source if n not in names)
    if not names:
        return None
    specs = []
    for name in names:
        arrow_type = None
        if isinstance(mysql_type, dict) and isinstance(mysql_type.get(name), str):
            arrow_type = from_mysql_type(mysql_type[name])
        if arrow_type is None and isinstance(sql_type, dict) and type(sql_type.get(name)) is int:
            arrow_type = _JDBC.get(sql_type[name])
        specs.append(ColumnSpec(name, arrow_type or pa.string(), pre=_latin1 if arrow_type == pa.binary() else None))
    return specs


def _latin1(v: object) -> object:
    """Canal writes binary columns as ISO-8859-1 text."""
    return v.encode("latin-1") if isinstance(v, str) else v
