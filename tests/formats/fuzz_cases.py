"""Generated change messages of every format, with the rows they must decode to.

A *truth row* holds Python values of every kind a source database can hold (BIGINT
±(2^63-1), INT/SMALLINT/TINYINT limits, DECIMAL(38, 10), DOUBLE NaN/±Inf/-0.0,
TIMESTAMP / TIMESTAMP_LTZ / DATE from 0001-01-01 to 9999-12-31 at microseconds,
strings with NUL, emoji, combining marks and right-to-left text, BINARY, NULLs).
A *writer* puts a change of truth rows on the wire the way the format's producer
does; a *spoiler* turns a well-formed message into a malformed one of a named kind.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import orjson
from hypothesis import strategies as st

from changelake.formats.sqltypes import sql_schema

EPOCH = dt.datetime(1970, 1, 1)
UTC = dt.timezone.utc
MARK = "Zq9#Zq"         # replaced by invalid UTF-8 of the same length
BAD_UTF8 = [b"Zq\xff#Zq", b"Z\xc0\xaf#Zq", b"\xed\xa0\x809#Z", b"Zq9#Z\xe2"]   # bad byte, overlong, surrogate, cut

I64 = 2 ** 63 - 1
DEC_MAX = decimal.Decimal("9999999999999999999999999999.9999999999")
MIN_TS, MAX_TS = dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)


def _edge(strategy, *edges):
    return st.one_of(st.none(), st.sampled_from(edges), strategy)


TEXTS = ["", "a\x00b", "\U0001f600\U0001f3f3\ufe0f\u200d\U0001f308", "e\u0301\u0323", "\u05e9\u05dc\u05d5\u05dd \u0627\u0644",
         "\u202eabc\u202c", "\\\"\n\t"]
VALUES = {
    "big": _edge(st.integers(-I64, I64), I64, -I64, 0),
    "i": _edge(st.integers(-2 ** 31, 2 ** 31 - 1), 2 ** 31 - 1, -2 ** 31),
    "s": _edge(st.integers(-2 ** 15, 2 ** 15 - 1), 2 ** 15 - 1, -2 ** 15),
    "t": _edge(st.integers(-128, 127), 127, -128),
    # unscaled integers: hypothesis' decimals() works in the 28-digit default context and overshoots the bounds
    "dec": _edge(st.integers(-(10 ** 38 - 1), 10 ** 38 - 1).map(lambda n: decimal.Decimal((n < 0, tuple(map(int, str(abs(n)))), -10))),
                 DEC_MAX, DEC_MAX.copy_negate(), decimal.Decimal("0E-10")),   # unary minus rounds to 28 digits
    "dbl": _edge(st.floats(), math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308),
    "ts": _edge(st.datetimes(MIN_TS, MAX_TS), MIN_TS, MAX_TS),
    "ltz": _edge(st.datetimes(MIN_TS, MAX_TS), MIN_TS, MAX_TS),
    "day": _edge(st.dates(), dt.date(1, 1, 1), dt.date(9999, 12, 31)),
    "txt": _edge(st.text(st.characters(exclude_categories=["Cs"]), max_size=12), *TEXTS),
    "bin": _edge(st.binary(max_size=12), b"", b"\x00\xff\x80"),
}
NAMES = ["id", *VALUES]
SQL = {"id": "BIGINT NOT NULL", "big": "BIGINT", "i": "INT", "s": "SMALLINT", "t": "TINYINT",
       "dec": "DECIMAL(38, 10)", "dbl": "DOUBLE", "ts": "TIMESTAMP(6)", "ltz": "TIMESTAMP_LTZ(6)", "day": "DATE",
       "txt": "STRING", "bin": "BYTES"}

#: the columns the JSON bulk path can read: a healthy chunk of these must take it
BULK_NAMES = ["id", "big", "i", "s", "t", "dec", "dbl", "ts", "day", "txt"]


@st.composite
def truth_row(draw, names=tuple(NAMES), finite: bool = False) -> dict:
    row = {"id": 0}
    for name in names[1:]:
        v = draw(VALUES[name])
        if finite and isinstance(v, float) and not math.isfinite(v):
            v = -0.0
        row[name] = v
    return row


# --- wire forms of single values -------------------------------------------------------------

def micros(t: dt.datetime) -> int:
    d = t - EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def days(d: dt.date) -> int:
    return (d - EPOCH.date()).days


def unscaled_b64(d: decimal.Decimal) -> str:
    n = int(d.scaleb(10, decimal.Context(prec=60)))
    return base64.b64encode(n.to_bytes(17, "big", signed=True)).decode()


def double(v: float) -> Any:
    """Jackson (Kafka's JsonConverter) writes non-finite doubles as quoted text."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def double_text(v: float) -> str:
    return str(double(v)) if not math.isfinite(v) else repr(v)


def sql_text(t: dt.datetime) -> str:
    return t.isoformat(" ", "microseconds")   # strftime's %Y drops leading zeros (year 1 -> "1")


def zoned(t: dt.datetime) -> str:
    return t.isoformat("T", "microseconds") + "Z"


class Literal(str):
    """JSON text written as is: a number literal (exact decimals, as Maxwell and OGG write them), or
    a value of the wrong type put in by a spoiler."""


def dumps(obj: Any) -> bytes:
    """JSON with :class:`Literal` values unquoted."""
    literals: list[str] = []

    def default(o):
        raise TypeError(o)

    def swap(o):
        if isinstance(o, Literal):
            literals.append(str(o))
            return f"\u0001{len(literals) - 1}\u0001"
        if isinstance(o, dict):
            return {k: swap(v) for k, v in o.items()}
        if isinstance(o, list):
            return [swap(v) for v in o]
        return o

    text = orjson.dumps(swap(obj), default=default)
    for i, lit in enumerate(literals):
        text = text.replace(f'"\\u0001{i}\\u0001"'.encode(), lit.encode())
    return text


def _map(row: dict | None, enc: dict[str, Callable[[Any], Any]]) -> dict | None:
    if row is None:
        return None
    return {k: (v if v is None or isinstance(v, Literal) else enc.get(k, lambda x: x)(v)) for k, v in row.items()}


def plain(d: decimal.Decimal) -> str:
    """A decimal as plain text, as Java's BigDecimal.toPlainString writes it."""
    return format(d, "f")


# --- formats ---------------------------------------------------------------------------------

#: kinds of malformed message and the dead-letter reasons each may get
SPOILED = {
    "truncated": {"malformed"},
    "non-utf8-value": {"malformed"},
    "non-utf8-field-name": {"malformed"},
    "wrong-type": {"schema-mismatch"},
    "out-of-range": {"schema-mismatch"},
    "unknown-op": {"unknown-op"},
    "empty": {"malformed", "unknown-op"},
    "not-json": {"malformed"},
    "not-an-envelope": {"malformed", "unknown-op"},
    "bad-frame": {"malformed"},
}
TEXT_KINDS = tuple(k for k in SPOILED if k != "bad-frame")
AVRO_KINDS = ("truncated", "non-utf8-value", "unknown-op", "empty", "not-an-envelope", "bad-frame")


DBZ_BARE = {"dec": plain, "dbl": double, "ts": micros, "ltz": zoned, "day": days,
            "bin": lambda b: base64.b64encode(b).decode()}
DBZ_SCHEMA = {**DBZ_BARE, "dec": unscaled_b64}
TEXTUAL = {"big": str, "i": str, "s": str, "t": str, "dec": plain, "dbl": double_text, "ts": sql_text,
           "ltz": sql_text, "day": dt.date.isoformat, "bin": lambda b: b.decode("latin-1")}
TYPED = {"dec": lambda d: Literal(plain(d)), "dbl": double, "ts": sql_text, "ltz": sql_text, "day": dt.date.isoformat,
         "bin": lambda b: base64.b64encode(b).decode()}

#: declared encodings of the schema-less Debezium JSON columns
DBZ_ENCODINGS = {"dec": "decimal-string", "ts": "io.debezium.time.MicroTimestamp",
                 "ltz": "io.debezium.time.ZonedTimestamp", "day": "io.debezium.time.Date"}


def declared(names, encodings=None):
    encodings = encodings or {}
    return sql_schema([(n, SQL[n], encodings.get(n)) for n in names])


_CONNECT = {"id": {"type": "int64"}, "big": {"type": "int64"}, "i": {"type": "int32"}, "s": {"type": "int16"},
            "t": {"type": "int8"}, "dbl": {"type": "float64"}, "txt": {"type": "string"}, "bin": {"type": "bytes"},
            "dec": {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                    "parameters": {"scale": "10", "connect.decimal.precision": "38"}},
            "ts": {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
            "ltz": {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
            "day": {"type": "int32", "name": "io.debezium.time.Date"}}


def connect_schema(names) -> dict:
    row = [{**_CONNECT[n], "optional": n != "id", "field": n} for n in names]
    return {"type": "struct", "name": "shop.items.Envelope", "fields": [
        {"type": "struct", "fields": row, "optional": True, "name": "shop.items.Value", "field": "before"},
        {"type": "struct", "fields": row, "optional": True, "name": "shop.items.Value", "field": "after"},
        {"type": "string", "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}


_AVRO = {"id": "long", "big": "long", "i": "int", "s": {"type": "int", "connect.type": "int16"},
         "t": {"type": "int", "connect.type": "int8"}, "dbl": "double", "txt": "string", "bin": "bytes",
         "dec": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10,
                 "connect.name": "org.apache.kafka.connect.data.Decimal"},
         "ts": {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"},
         "ltz": {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"},
         "day": {"type": "int", "connect.name": "io.debezium.time.Date"}}


def avro_schema(names) -> dict:
    row = {"type": "record", "name": "Value", "namespace": "shop.items", "fields": [
        {"name": n, "type": _AVRO[n] if n == "id" else ["null", _AVRO[n]], **({} if n == "id" else {"default": None})}
        for n in names]}
    return {"type": "record", "name": "Envelope", "namespace": "shop.items", "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "ts_ms", "type": "long"}, {"name": "db", "type": "string"},
            {"name": "table", "type": ["null", "string"], "default": None}]}},
        {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


@dataclass
class Change:
    """One well-formed change: op 'c', 'u' or 'd' with its before / after truth rows."""

    op: str
    before: dict | None
    after: dict | None

    def rows(self) -> list[tuple[int, dict]]:
        """(kind, row) the change decodes to."""
        return {"c": [(0, self.after)], "u": [(1, self.before), (2, self.after)], "d": [(3, self.before)]}[self.op]


SOURCE = {"ts_ms": 1_700_000_000_000, "db": "shop", "table": "items"}


class Format:
    """How one variant of a format writes changes (and what its decoder is given)."""

    name: str = "?"
    fmt: str = "?"
    textual = True       # JSON text (else Avro)
    kinds = TEXT_KINDS   # the malformed kinds it can get

    def __init__(self, names=tuple(NAMES)) -> None:
        self.names = list(names)

    def write(self, c: Change) -> bytes:
        raise NotImplementedError

    def decoder_args(self) -> dict:
        return {}

    def with_op(self, c: Change, op: str) -> bytes:
        """The change with an op / type the format does not define."""
        raise NotImplementedError

    def not_envelope(self) -> bytes:
        """A JSON object that is not a change message of this format."""
        return b'{"id": 1, "name": "a row, not a change event"}'


class DebeziumBare(Format):
    name, fmt = "debezium-json", "debezium-json"

    def __init__(self, names=tuple(NAMES), *, declared_columns: bool = True) -> None:
        super().__init__(names)
        self.declared_columns = declared_columns

    def body(self, c: Change, op: str | None = None) -> dict:
        return {"before": _map(c.before, DBZ_BARE), "after": _map(c.after, DBZ_BARE), "source": SOURCE,
                "op": c.op if op is None else op, "ts_ms": 1}

    def write(self, c: Change) -> bytes:
        return dumps(self.body(c))

    def with_op(self, c: Change, op: str) -> bytes:
        return dumps(self.body(c, op))

    def decoder_args(self) -> dict:
        return {"columns": declared(self.names, DBZ_ENCODINGS)}


class DebeziumEnvelope(DebeziumBare):
    name = "debezium-json+schema"

    def body(self, c: Change, op: str | None = None) -> dict:
        return {"schema": connect_schema(self.names), "payload": {
            "before": _map(c.before, DBZ_SCHEMA), "after": _map(c.after, DBZ_SCHEMA), "source": SOURCE,
            "op": c.op if op is None else op, "ts_ms": 1}}

    def decoder_args(self) -> dict:
        # declared types (the schema gives the encodings), or none at all (the schema gives both)
        return {"columns": declared(self.names) if self.declared_columns else None,
                "options": {"schema-include": True}}

    def not_envelope(self) -> bytes:
        return DebeziumBare(self.names).write(Change("c", None, {n: None for n in self.names} | {"id": 1}))


class DebeziumAvro(Format):
    name, fmt = "debezium-avro", "debezium-avro-confluent"
    textual, kinds = False, AVRO_KINDS
    OTHER = {"type": "record", "name": "Row", "namespace": "shop.items", "fields": [{"name": "id", "type": "long"}]}

    def __init__(self, names=tuple(NAMES), *, declared_columns: bool = True) -> None:
        super().__init__(names)
        self.declared_columns = declared_columns
        self.schema = avro_schema(self.names)
        self.parsed = fastavro.parse_schema(self.schema)

    def _avro_row(self, row):
        return _map(row, {"ts": micros, "ltz": zoned, "day": days})

    def write(self, c: Change, op: str | None = None) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.parsed, {"before": self._avro_row(c.before),
                                                      "after": self._avro_row(c.after), "source": SOURCE,
                                                      "op": c.op if op is None else op, "ts_ms": 1})
        return b"\x00" + struct.pack(">I", 7) + buf.getvalue()

    def with_op(self, c: Change, op: str) -> bytes:
        return self.write(c, op)

    def decoder_args(self) -> dict:
        return {"columns": declared(self.names) if self.declared_columns else None,
                "schema_lookup": {7: self.schema, 8: self.OTHER}.__getitem__}

    def not_envelope(self) -> bytes:
        """A row record registered under its own schema id: valid Avro, but no change event."""
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(self.OTHER), {"id": 1})
        return b"\x00" + struct.pack(">I", 8) + buf.getvalue()


class Canal(Format):
    name, fmt = "canal-json", "canal-json"
    _MYSQL = {"id": "bigint(20)", "big": "bigint(20)", "i": "int(11)", "s": "smallint(6)", "t": "tinyint(4)",
              "dec": "decimal(38,10)", "dbl": "double", "ts": "datetime(6)", "ltz": "timestamp(6)", "day": "date",
              "txt": "varchar(255)", "bin": "varbinary(255)"}

    def __init__(self, names=tuple(NAMES), *, declared_columns: bool = True) -> None:
        super().__init__(names)
        self.declared_columns = declared_columns

    def body(self, c: Change, kind: str | None = None) -> dict:
        data = c.after if c.op != "d" else c.before
        msg = {"data": [_map(data, TEXTUAL)], "database": "shop", "table": "items", "pkNames": ["id"],
               "isDdl": False, "type": kind if kind is not None else {"c": "INSERT", "u": "UPDATE", "d": "DELETE"}[c.op],
               "es": 1_700_000_000_000, "ts": 1_700_000_000_001,
               "mysqlType": {n: self._MYSQL[n] for n in self.names}, "old": None}
        if c.op == "u":
            msg["old"] = [_map(c.before, TEXTUAL)]
        return msg

    def write(self, c: Change) -> bytes:
        return dumps(self.body(c))

    def with_op(self, c: Change, op: str) -> bytes:
        return dumps(self.body(c, op))

    def decoder_args(self) -> dict:
        return {"columns": declared(self.names) if self.declared_columns else None}


class Maxwell(Format):
    name, fmt = "maxwell-json", "maxwell-json"

    def body(self, c: Change, kind: str | None = None) -> dict:
        data = c.after if c.op != "d" else c.before
        msg = {"database": "shop", "table": "items", "type": kind if kind is not None
               else {"c": "insert", "u": "update", "d": "delete"}[c.op],
               "ts": 1_700_000_000, "xid": 1, "commit": True, "data": _map(data, TYPED)}
        if c.op == "u":
            msg["old"] = _map(c.before, TYPED)
        return msg

    def write(self, c: Change) -> bytes:
        return dumps(self.body(c))

    def with_op(self, c: Change, op: str) -> bytes:
        return dumps(self.body(c, op))

    def decoder_args(self) -> dict:
        return {"columns": declared(self.names)}


class Ogg(Format):
    name, fmt = "ogg-json", "ogg-json"

    def body(self, c: Change, kind: str | None = None) -> dict:
        msg = {"table": "SHOP.ITEMS", "op_type": kind if kind is not None else {"c": "I", "u": "U", "d": "D"}[c.op],
               "op_ts": "2024-01-01 00:00:00.000000", "current_ts": "2024-01-01T00:00:01.000000", "pos": "0001"}
        if c.before is not None:
            msg["before"] = _map(c.before, TYPED)
        if c.after is not None:
            msg["after"] = _map(c.after, TYPED)
        return msg

    def write(self, c: Change) -> bytes:
        return dumps(self.body(c))

    def with_op(self, c: Change, op: str) -> bytes:
        return dumps(self.body(c, op))

    def decoder_args(self) -> dict:
        return {"columns": declared(self.names)}


# --- malformed messages ----------------------------------------------------------------------


WRONG = {  # column -> values of a wrong type for it (as JSON values)
    "big": ["12a", True, {"x": 1}, [1], 1.5], "i": ["x", 2.5, [2]], "t": [False, "1.0e"], "dec": [True, {"a": 1}, "1/2"],
    "dbl": [True, "one", {"a": 1}], "ts": [True, "yesterday", [1]], "day": ["2024-13-01", True], "bin": [12, True],
}
OUT_OF_RANGE = {  # column -> values beyond its type (as JSON literals)
    "big": ["9223372036854775808", "-9223372036854775809", "100000000000000000000000"], "i": ["2147483648"],
    "s": ["-32769"], "t": ["128", "-129"], "ts": ["253402300800000000", "-62135596800000001"], "day": ["2932897"],
}


def spoil(draw, f: Format, c: Change, kind: str) -> bytes:
    """A malformed message of ``kind`` made from change ``c``."""
    if kind == "truncated":
        good = f.write(c)
        return good[:draw(st.integers(1, len(good) - 1))]
    if kind == "unknown-op":
        return f.with_op(c, draw(st.sampled_from(["x", "U ", "", "insert" if f.fmt != "maxwell-json" else "INSERT"])))
    if kind == "empty":
        return draw(st.sampled_from([b"{}", b" ", b"\n", b"\x00"] if f.textual else [b"\x00"]))
    if kind == "not-json":
        return draw(st.sampled_from([b"null", b"[1,2]", b"42", b'"text"', b"{'single': 1}", b"{\"a\":NaN}"]))
    if kind == "not-an-envelope":
        return f.not_envelope()
    image = dict(c.after if c.after is not None else c.before)
    if kind in ("non-utf8-value", "non-utf8-field-name"):
        if kind == "non-utf8-value":
            image["txt"] = draw(st.sampled_from(["", "ab"])) + MARK
        else:
            image[MARK] = 1
        text = f.write(_with_image(c, image))
        return text.replace(MARK.encode(), draw(st.sampled_from(BAD_UTF8)), 1)
    if kind == "wrong-type":
        column = draw(st.sampled_from([n for n in WRONG if n in f.names]))
        image[column] = Literal(json.dumps(draw(st.sampled_from(WRONG[column]))))
        return f.write(_with_image(c, image))
    if kind == "out-of-range":
        column = draw(st.sampled_from([n for n in OUT_OF_RANGE if n in f.names]))
        literal = draw(st.sampled_from(OUT_OF_RANGE[column]))
        image[column] = Literal(f'"{literal}"' if isinstance(f, Canal) else literal)
        return f.write(_with_image(c, image))
    if kind == "bad-frame":
        return draw(st.sampled_from([b"\x01\x00\x00\x00\x07\x00", b"\x00\x00\x00\x00\x09\x02",
                                     b"\x00\x00\x00", b"{}"]))
    raise AssertionError(kind)


def _with_image(c: Change, image: dict) -> Change:
    if c.op == "c":
        return Change("c", None, image)
    if c.op == "d":
        return Change("d", image, None)
    return Change("u", c.before, image)


# --- comparing decoded rows with the truth ----------------------------------------------------

def comparable(v: Any) -> Any:
    """A value in a form where equal means the same value: NaN equals NaN, -0.0 differs from 0.0,
    a timestamp in UTC compares as its naive UTC time, a decimal as its exact value."""
    if isinstance(v, float):
        return ("float", "nan") if math.isnan(v) else ("float", v, math.copysign(1.0, v))
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(UTC).replace(tzinfo=None)
    if isinstance(v, decimal.Decimal):
        return ("decimal", v.normalize() if v else decimal.Decimal(0))
    return v
