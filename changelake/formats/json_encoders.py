"""Changelog rows -> JSON change messages, as Flink's JSON format writers produce them.

Used to write a changelog back out (and by the round-trip tests). Each row
becomes one message; the writers keep no state, so an update is written as its
two halves::

    format          +I / +U                                 -U / -D
    debezium-json   {"before":null,"after":ROW,"op":"c"}    {"before":ROW,"after":null,"op":"d"}
    canal-json      {"data":[ROW],"type":"INSERT"}          {"data":[ROW],"type":"DELETE"}
    maxwell-json    {"data":ROW,"type":"insert"}            {"data":ROW,"type":"delete"}
    ogg-json        {"before":null,"after":ROW,"op_type":"I"}  {"before":ROW,"after":null,"op_type":"D"}

ROW holds the user columns (reserved ``_`` columns are left out). FLOAT and
DOUBLE values are written the way Java's ``Float.toString`` /
``Double.toString`` print them (``3.14``, ``1.0E-5``), timestamps in the
``timestamp-format.standard`` layout, decimals as plain numbers.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.types as pat

from changelake.changelog import KIND, RowKind, user_columns
from changelake.errors import ConfigError
from changelake.formats.options import Option, json_format_options, parse_options

ENCODER_FORMATS = ("debezium-json", "canal-json", "maxwell-json", "ogg-json")


def _envelope(fmt: str, accumulate: bool, row: str) -> str:
    if fmt == "debezium-json":
        return f'{{"before":null,"after":{row},"op":"c"}}' if accumulate else \
            f'{{"before":{row},"after":null,"op":"d"}}'
    if fmt == "canal-json":
        return f'{{"data":[{row}],"type":"{"INSERT" if accumulate else "DELETE"}"}}'
    if fmt == "maxwell-json":
        return f'{{"data":{row},"type":"{"insert" if accumulate else "delete"}"}}'
    return f'{{"before":null,"after":{row},"op_type":"I"}}' if accumulate else \
        f'{{"before":{row},"after":null,"op_type":"D"}}'


def encode(fmt: str, rows: pa.Table, *, options: Mapping[str, Any] | None = None) -> list[bytes]:
    """One JSON message per changelog row of ``rows`` (user columns + ``_kind``)."""
    if fmt not in ENCODER_FORMATS:
        raise ConfigError(f"no encoder for format {fmt!r}; encoders exist for {', '.join(ENCODER_FORMATS)}")
    specs = [Option("schema-include", "bool", False)] if fmt == "debezium-json" else []
    opts = parse_options(fmt, options, [*json_format_options(), *specs,
                                        Option("metadata", "metadata", (), ())])
    if opts.get("schema_include"):
        raise ConfigError("Debezium JSON serialization doesn't support 'debezium-json.schema-include' option "
                          "been set to true.")
    names = user_columns(rows)
    writers = [_writer(rows.schema.field(n).type, opts) for n in names]
    skip_nulls = opts["encode_ignore_null_fields"]
    out = []
    for kind, values in zip(rows.column(KIND).to_pylist(), zip(*(rows.column(n).to_pylist() for n in names))):
        parts = [f"{orjson.dumps(n).decode()}:{'null' if v is None else w(v)}"
                 for n, v, w in zip(names, values, writers) if not (skip_nulls and v is None)]
        out.append(_envelope(fmt, RowKind(kind).is_accumulate, "{" + ",".join(parts) + "}").encode())
    return out


def _writer(t: pa.DataType, opts: dict):
    if pat.is_float32(t):
        return lambda v: java_float_text(float(np.float32(v)), single=True)
    if pat.is_floating(t):
        return lambda v: java_float_text(v, single=False)
    if pat.is_decimal(t):
        plain = opts["encode_decimal_as_plain_number"]
        return lambda v: format(v, "f") if plain else str(v)
    if pat.is_timestamp(t):
        sep = "T" if opts["timestamp_format_standard"] == "ISO-8601" else " "
        zone = "Z" if t.tz is not None else ""
        return lambda v: orjson.dumps(_timestamp_text(v, sep) + zone).decode()
    if pat.is_date(t) or pat.is_time(t):
        return lambda v: orjson.dumps(v.isoformat()).decode()
    if pat.is_binary(t) or pat.is_large_binary(t):
        import base64
        return lambda v: orjson.dumps(base64.b64encode(v).decode()).decode()
    return lambda v: orjson.dumps(v, default=_default).decode()


def _timestamp_text(v: dt.datetime, sep: str) -> str:
    text = v.replace(tzinfo=None).isoformat(sep=sep, timespec="microseconds")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _default(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return str(v)
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def java_float_text(v: float, *, single: bool) -> str:
    """``Float.toString`` / ``Double.toString``: shortest round-tripping digits, ``1.0``, ``1.0E-5``."""
    if v != v:
        return '"NaN"'
    if v in (float("inf"), float("-inf")):
        return '"Infinity"' if v > 0 else '"-Infinity"'
    x = np.float32(v) if single else np.float64(v)
    if v == 0:
        return "-0.0" if np.signbit(x) else "0.0"
    if 1e-3 <= abs(v) < 1e7:
        text = np.format_float_positional(x, unique=True, trim="0")
        return text + "0" if text.endswith(".") else text
    mantissa, exponent = np.format_float_scientific(x, unique=True, trim="0").split("e")
    mantissa = mantissa + "0" if mantissa.endswith(".") else mantissa
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}E{int(exponent)}"
