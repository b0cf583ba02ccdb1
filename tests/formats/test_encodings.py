"""Declared wire encodings (issue #11, item 4): a schema-less column says how its value is
written; values written that way are read exactly, anything else is a schema-mismatch dead
letter naming the column, never a crash and never a silent reinterpretation."""

from __future__ import annotations

import base64
import datetime as dt
import decimal

import orjson
import pyarrow as pa
import pytest

from changelake.errors import ConfigError
from changelake.formats import make_decoder
from changelake.formats.debezium_bulk import decode_json_chunk
from changelake.formats.encodings import ENCODINGS, encoded, field_encoding
from changelake.formats.sqltypes import sql_schema
from changelake.service.config import parse_config
from changelake.formats.encodings import source_schema as arrow_schema
from tests.formats.helpers import change, records

pytestmark = pytest.mark.unit

UTC = dt.timezone.utc
MIN_TS, MAX_TS = dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
EPOCH = dt.datetime(1970, 1, 1)


def micros(t: dt.datetime) -> int:
    d = t - EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def unscaled(n: int) -> str:
    return base64.b64encode(n.to_bytes(17, "big", signed=True)).decode()


# (encoding, declared type, value on the wire, value read) - every encoding at least once, limits included
GOOD = [
    ("io.debezium.time.Date", "date", -719_162, dt.date(1, 1, 1)),
    ("io.debezium.time.Date", "date", 2_932_896, dt.date(9999, 12, 31)),
    ("org.apache.kafka.connect.data.Date", "date", 0, dt.date(1970, 1, 1)),
    ("epoch-days", "date", "19723", dt.date(2024, 1, 1)),            # Canal sends digits as text
    ("io.debezium.time.Time", "TIME(3)", 86_399_999, dt.time(23, 59, 59, 999000)),
    ("org.apache.kafka.connect.data.Time", "TIME(3)", 0, dt.time(0)),
    ("io.debezium.time.MicroTime", "TIME(6)", 86_399_999_999, dt.time(23, 59, 59, 999999)),
    ("io.debezium.time.NanoTime", "TIME(6)", 1_000, dt.time(0, 0, 0, 1)),
    ("io.debezium.time.Timestamp", "timestamp_ntz", 1_700_000_000_123, dt.datetime(2023, 11, 14, 22, 13, 20, 123000)),
    ("org.apache.kafka.connect.data.Timestamp", "timestamp_ntz", -1, dt.datetime(1969, 12, 31, 23, 59, 59, 999000)),
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", micros(MIN_TS), MIN_TS),
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", micros(MAX_TS), MAX_TS),
    ("io.debezium.time.MicroTimestamp", "timestamp", micros(MAX_TS), MAX_TS.replace(tzinfo=UTC)),
    ("io.debezium.time.NanoTimestamp", "timestamp_ntz", 1_700_000_000_123_456_000,
     dt.datetime(2023, 11, 14, 22, 13, 20, 123456)),
    ("epoch-seconds", "timestamp", 253_402_300_799, dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ("epoch-millis", "timestamp_ntz", -62_135_596_800_000, MIN_TS),
    ("epoch-micros", "timestamp_ntz", 1, dt.datetime(1970, 1, 1, 0, 0, 0, 1)),
    ("epoch-nanos", "timestamp_ntz", 2_000, dt.datetime(1970, 1, 1, 0, 0, 0, 2)),
    ("io.debezium.time.ZonedTimestamp", "timestamp", "2024-01-01T02:00:00.123456+02:00",
     dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    ("io.debezium.time.ZonedTimestamp", "timestamp_ntz", "9999-12-31T23:59:59.999999Z", MAX_TS),
    ("iso-8601", "timestamp", "0001-01-01T00:00:00", dt.datetime(1, 1, 1, tzinfo=UTC)),
    ("iso-8601", "timestamp_ntz", "2024-02-29 12:34:56.789012", dt.datetime(2024, 2, 29, 12, 34, 56, 789012)),
    ("iso-8601", "date", "9999-12-31", dt.date(9999, 12, 31)),
    ("iso-8601", "TIME(6)", "23:59:59.999999", dt.time(23, 59, 59, 999999)),
    ("org.apache.kafka.connect.data.Decimal", "decimal(38,10)", unscaled(10 ** 38 - 1),
     decimal.Decimal("9999999999999999999999999999.9999999999")),
    ("decimal-base64", "decimal(38,10)", unscaled(-(10 ** 38 - 1)),
     decimal.Decimal("-9999999999999999999999999999.9999999999")),
    ("decimal-string", "decimal(38,0)", "99999999999999999999999999999999999999", decimal.Decimal(10 ** 38 - 1)),
    ("decimal-string", "decimal(10,2)", "-0.5", decimal.Decimal("-0.50")),
    ("io.debezium.data.VariableScaleDecimal", "decimal(20,5)", {"scale": 3, "value": unscaled(-12345)},
     decimal.Decimal("-12.34500")),
    ("io.debezium.data.VariableScaleDecimal", "string", {"scale": 30, "value": unscaled(1)}, "1E-30"),
    ("base64", "bytes", base64.b64encode(b"\x00\xff\x00").decode(), b"\x00\xff\x00"),
    ("base64-url-safe", "bytes", "_-8", b"\xff\xef"),
    ("hex", "bytes", "00ff10", b"\x00\xff\x10"),
    ("iso-8859-1", "bytes", "\u00ff\u0000a", b"\xff\x00a"),
]

# (encoding, declared type, a value not written that way)
BAD = [
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", "2024-01-01T00:00:00"),   # text, not an integer
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", 1.5),
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", True),
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", micros(MAX_TS) + 1),       # after 9999-12-31
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", micros(MIN_TS) - 1),       # before 0001-01-01
    ("io.debezium.time.MicroTimestamp", "timestamp_ntz", 2 ** 63 - 1),
    ("epoch-millis", "timestamp", 2 ** 70),                                         # beyond 64 bits
    ("epoch-millis", "timestamp", "12a"),
    ("io.debezium.time.Date", "date", 2_932_897),
    ("io.debezium.time.Date", "date", "2024-01-01"),
    ("io.debezium.time.MicroTime", "TIME(6)", 86_400_000_000),                      # not a time of day
    ("io.debezium.time.MicroTime", "TIME(6)", -1),
    ("io.debezium.time.ZonedTimestamp", "timestamp", "2024-01-01T00:00:00"),        # no offset
    ("io.debezium.time.ZonedTimestamp", "timestamp", 1_700_000_000_000),
    ("iso-8601", "timestamp_ntz", 1_700_000_000_000),
    ("iso-8601", "date", "2024-01-01 garbage"),
    ("iso-8601", "date", "10000-01-01"),
    ("decimal-string", "decimal(10,2)", 1.5),                                       # a number, not text
    ("decimal-string", "decimal(10,2)", "1.555"),                                   # more places than the scale
    ("decimal-string", "decimal(4,2)", "123.45"),                                   # more digits than the precision
    ("decimal-string", "decimal(10,2)", "NaN"),
    ("org.apache.kafka.connect.data.Decimal", "decimal(10,2)", "not base64!"),
    ("org.apache.kafka.connect.data.Decimal", "decimal(4,2)", unscaled(123456)),
    ("io.debezium.data.VariableScaleDecimal", "decimal(10,2)", "1.5"),
    ("io.debezium.data.VariableScaleDecimal", "decimal(10,2)", {"scale": 3, "value": unscaled(1)}),  # 0.001
    ("base64", "bytes", "***"),
    ("hex", "bytes", "0g"),
    ("hex", "bytes", 12),
]


def _decoder(encoding: str, type_text: str, fmt: str = "debezium-json"):
    columns = {"id": "bigint", "v": {"type": type_text, "encoding": encoding}} if type_text[0].islower() else None
    schema = arrow_schema(columns) if columns else sql_schema([("id", "BIGINT"), ("v", type_text, encoding)])
    return make_decoder(fmt, columns=schema)


@pytest.mark.parametrize(("encoding", "type_text", "wire", "expected"), GOOD,
                         ids=[f"{e}-{t}-{i}" for i, (e, t, _, _) in enumerate(GOOD)])
def test_values_written_as_declared_are_read_exactly(encoding, type_text, wire, expected) -> None:
    decoder = _decoder(encoding, type_text)
    out = decoder.decode(records([change("c", after={"id": 1, "v": wire}), change("c", after={"id": 2, "v": None})]))
    assert out.dead_letters.num_rows == 0, out.dead_letters.column("error").to_pylist()
    assert out.rows.column("v").to_pylist() == [expected, None]
    out.rows.validate(full=True)


@pytest.mark.parametrize(("encoding", "type_text", "wire"), BAD,
                         ids=[f"{e}-{t}-{i}" for i, (e, t, _) in enumerate(BAD)])
def test_other_values_are_schema_mismatches_naming_the_column(encoding, type_text, wire) -> None:
    decoder = _decoder(encoding, type_text)
    good = change("c", after={"id": 1, "v": None})
    bad = orjson.dumps(change("c", after={"id": 2, "v": wire}) if not isinstance(wire, int) or abs(wire) < 2 ** 63
                       else change("c", after={"id": 2, "v": 0})).replace(b'"v":0', f'"v":{wire}'.encode())
    out = decoder.decode(records([good, bad, good]))
    assert out.rows.column("id").to_pylist() == [1, 1]
    letter = out.dead_letters.to_pylist()
    assert [d["reason"] for d in letter] == ["schema-mismatch"] and letter[0]["value"] == bad
    assert "column 'v'" in letter[0]["error"]


def test_the_issue_case_micro_timestamps_without_schema() -> None:
    """DATETIME(6) from a schemas.enable=false topic, declared timestamp_ntz: read as ms without an
    encoding it is far beyond 9999 (a dead letter that says what to declare), with it exact."""
    value = micros(dt.datetime(2024, 5, 6, 7, 8, 9, 123456))
    message = change("c", after={"id": 1, "created": value})
    plain = make_decoder("debezium-json", columns=arrow_schema({"id": "bigint", "created": "timestamp_ntz"}))
    out = plain.decode(records([message]))
    assert out.rows.num_rows == 0
    assert "declare the column's encoding" in out.dead_letters.column("error")[0].as_py()
    declared = make_decoder("debezium-json", columns=arrow_schema(
        {"id": "bigint", "created": {"type": "timestamp_ntz", "encoding": "io.debezium.time.MicroTimestamp"}}))
    assert declared.decode(records([message])).rows.column("created").to_pylist() == [
        dt.datetime(2024, 5, 6, 7, 8, 9, 123456)]


def test_integer_encodings_keep_the_bulk_path() -> None:
    columns = arrow_schema({"id": "bigint", "t": {"type": "timestamp", "encoding": "io.debezium.time.MicroTimestamp"},
                            "d": {"type": "date", "encoding": "io.debezium.time.Date"},
                            "p": {"type": "decimal(12,3)", "encoding": "decimal-string"}})
    decoder = make_decoder("debezium-json", columns=columns)
    values = [change("c", after={"id": i, "t": micros(MAX_TS) - i, "d": 2_932_896 - i, "p": f"{i}.125"})
              for i in range(50)]
    table = records(values)
    bulk = decode_json_chunk(decoder._bulk_plan(), table, key=())
    assert bulk is not None, "the bulk path declined integer-encoded columns"
    assert bulk.rows.to_pylist() == decoder._decode(table).rows.to_pylist()
    # a value of another JSON type sends the chunk message by message, where it is a dead letter
    mixed = records([*values, change("c", after={"id": 99, "t": "2024-01-01", "d": 1, "p": "1"})])
    assert decode_json_chunk(decoder._bulk_plan(), mixed, key=()) is None
    assert decoder.decode(mixed).dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


def test_the_envelope_schema_wins_over_the_declared_encoding() -> None:
    schema = {"type": "struct", "fields": [
        {"type": "struct", "field": "after", "optional": True, "fields": [
            {"type": "int64", "field": "id"},
            {"type": "int64", "field": "t", "name": "io.debezium.time.Timestamp"}]}]}
    columns = arrow_schema({"id": "bigint", "t": {"type": "timestamp_ntz", "encoding": "io.debezium.time.MicroTimestamp"}})
    decoder = make_decoder("debezium-json", columns=columns)
    out = decoder.decode(records([{"schema": schema, "payload": change("c", after={"id": 1, "t": 1_000})}]))
    assert out.rows.column("t").to_pylist() == [dt.datetime(1970, 1, 1, 0, 0, 1)]   # milliseconds, as the schema says


CANAL = {"database": "db", "table": "t", "type": "INSERT", "isDdl": False, "es": 1, "ts": 2, "old": None}


@pytest.mark.parametrize("fmt", ["canal-json", "maxwell-json", "ogg-json"])
def test_other_formats_read_declared_encodings(fmt: str) -> None:
    columns = arrow_schema({"id": "bigint", "t": {"type": "timestamp_ntz", "encoding": "epoch-micros"},
                            "raw": {"type": "bytes", "encoding": "hex"}})
    row, bad = {"id": "1", "t": "1700000000123456", "raw": "ff"}, {"id": "2", "t": "2023-11-14", "raw": "ff"}
    if fmt != "canal-json":
        row, bad = {**row, "id": 1, "t": 1_700_000_000_123_456}, {**bad, "id": 2}
    wrap = {"canal-json": lambda r: {**CANAL, "data": [r]},
            "maxwell-json": lambda r: {"database": "db", "table": "t", "type": "insert", "ts": 1, "data": r},
            "ogg-json": lambda r: {"table": "S.T", "op_type": "I", "op_ts": "2024-01-01 00:00:00", "after": r}}[fmt]
    out = make_decoder(fmt, columns=columns).decode(records([wrap(row), wrap(bad)]))
    assert out.rows.select(["id", "t", "raw"]).to_pylist() == [
        {"id": 1, "t": dt.datetime(2023, 11, 14, 22, 13, 20, 123456), "raw": b"\xff"}]
    assert out.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]
    assert "column 't'" in out.dead_letters.column("error")[0].as_py()


def test_yaml_declaration() -> None:
    config = parse_config("""
pipeline: {id: p, checkpoint: /tmp/c}
kafka: {bootstrap_servers: "x:1"}
sources:
  - name: orders
    topics: [shop.orders]
    table: orders
    columns:
      id: bigint
      created: {type: timestamp_ntz, encoding: io.debezium.time.MicroTimestamp}
      price: {type: "decimal(10,2)", encoding: org.apache.kafka.connect.data.Decimal}
      total: {type: "decimal(12,4)", encoding: decimal-base64, scale: 2}
tables: [{name: orders, primary_key: [id]}]
""", environ={})
    schema = arrow_schema(config.sources[0].columns)
    assert [field_encoding(f) and (field_encoding(f).name, field_encoding(f).scale) for f in schema] == [
        None, ("io.debezium.time.MicroTimestamp", None), ("org.apache.kafka.connect.data.Decimal", 2),
        ("decimal-base64", 2)]
    decoder = make_decoder("debezium-json", columns=schema)
    out = decoder.decode(records([change("c", after={"id": 1, "created": 1, "price": unscaled(1999),
                                                     "total": unscaled(-5)})]))
    assert out.rows.select(["created", "price", "total"]).to_pylist() == [
        {"created": dt.datetime(1970, 1, 1, 0, 0, 0, 1), "price": decimal.Decimal("19.99"),
         "total": decimal.Decimal("-0.0500")}]


@pytest.mark.parametrize(("declaration", "message"), [
    ({"type": "timestamp", "encoding": "micros"}, "accepts: io.debezium.time.Timestamp"),
    ({"type": "bigint", "encoding": "epoch-millis"}, "takes no encoding"),
    ({"type": "date", "encoding": "io.debezium.time.MicroTimestamp"}, "a DATE column accepts: io.debezium.time.Date"),
    ({"type": "timestamp", "encodng": "iso-8601"}, "unknown key(s) ['encodng']"),
    ({"encoding": "iso-8601"}, "'type' is required"),
    ({"type": "decimal(10,2)", "encoding": "decimal-string", "scale": 2}, "'scale' only goes with"),
    ({"type": "decimal(10,2)", "encoding": "decimal-base64", "scale": "x"}, "whole number"),
])
def test_invalid_declarations_are_config_errors_listing_what_is_accepted(declaration, message) -> None:
    with pytest.raises(ConfigError) as info:
        arrow_schema({"c": declaration})
    assert message in str(info.value) and "'c'" in str(info.value)
    text = f"""
pipeline: {{id: p, checkpoint: /tmp/c}}
kafka: {{bootstrap_servers: "x:1"}}
sources: [{{name: s, topics: [t], columns: {{c: {orjson.dumps(declaration).decode()}}}}}]
tables: []
"""
    with pytest.raises(ConfigError, match="sources.0.columns"):
        parse_config(text, environ={})


def test_every_encoding_is_documented_and_tested() -> None:
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    tested = {e for e, *_ in GOOD}
    for name in ENCODINGS:
        assert f"`{name}`" in doc, f"docs/formats.md does not document encoding {name}"
        assert name in tested, f"no test reads encoding {name}"


def test_encoded_field_round_trips_through_the_schema() -> None:
    field = encoded(pa.field("p", pa.decimal128(10, 2)), "org.apache.kafka.connect.data.Decimal")
    assert field_encoding(field).scale == 2
    with pytest.raises(ConfigError):
        encoded(pa.field("p", pa.int64()), "iso-8601")


def test_connect_decimals_keep_38_digits_with_the_envelope_too() -> None:
    """The unscaled integer was scaled in Python's default 28-digit context: silently rounded."""
    schema = {"type": "struct", "fields": [{"type": "struct", "field": "after", "optional": True, "fields": [
        {"type": "int64", "field": "id"},
        {"type": "bytes", "field": "v", "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "10", "connect.decimal.precision": "38"}},
        {"type": "struct", "field": "w", "name": "io.debezium.data.VariableScaleDecimal", "fields": []}]}]}
    value = {"id": 1, "v": unscaled(10 ** 38 - 1), "w": {"scale": 10, "value": unscaled(-(10 ** 38 - 1))}}
    out = make_decoder("debezium-json").decode(records([{"schema": schema, "payload": change("c", after=value)}]))
    assert out.rows.select(["v", "w"]).to_pylist() == [{"v": decimal.Decimal("9999999999999999999999999999.9999999999"),
                                                        "w": "-9999999999999999999999999999.9999999999"}]


def test_canal_bytes_are_iso_8859_1_unless_declared_otherwise() -> None:
    data = bytes(range(256)).decode("latin-1")
    message = {**CANAL, "data": [{"id": "1", "raw": data, "b64": "AP8="}]}
    columns = arrow_schema({"id": "bigint", "raw": "bytes", "b64": {"type": "bytes", "encoding": "base64"}})
    out = make_decoder("canal-json", columns=columns).decode(records([message]))
    assert out.rows.select(["raw", "b64"]).to_pylist() == [{"raw": bytes(range(256)), "b64": b"\x00\xff"}]
    # a character beyond ISO-8859-1 cannot be a byte
    bad = {**CANAL, "data": [{"id": "2", "raw": "\u20ac", "b64": None}]}
    out = make_decoder("canal-json", columns=columns).decode(records([bad]))
    assert out.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


@pytest.mark.parametrize("fmt", ["maxwell-json", "ogg-json"])
def test_decimals_written_as_json_numbers_keep_every_digit(fmt: str) -> None:
    """Maxwell and OGG write DECIMAL values as JSON numbers; orjson reads those as doubles."""
    columns = sql_schema([("id", "BIGINT"), ("d", "DECIMAL(38,19)"), ("f", "DOUBLE")])
    row = b'{"id":1,"d":1234567890123456789.1234567890123456789,"f":0.30000000000000004}'
    wrap = {"maxwell-json": b'{"database":"db","table":"t","type":"insert","ts":1,"data":%s}',
            "ogg-json": b'{"table":"S.T","op_type":"I","op_ts":"2024-01-01 00:00:00","after":%s}'}[fmt]
    huge = wrap % b'{"id":-9223372036854775809,"d":1,"f":1}'   # beyond 64 bits: not silently -2^63
    out = make_decoder(fmt, columns=columns).decode(records([wrap % row, huge]))
    assert out.rows.select(["id", "d", "f"]).to_pylist() == [
        {"id": 1, "d": decimal.Decimal("1234567890123456789.1234567890123456789"), "f": 0.30000000000000004}]
    assert out.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]
    assert "column 'id'" in out.dead_letters.column("error")[0].as_py()


@pytest.mark.parametrize("fmt", ["debezium-json", "maxwell-json"])
def test_a_boolean_in_a_double_column_is_a_mismatch_after_a_number(fmt) -> None:
    """Arrow's inference reads [1.5, true] as doubles (true as 1.0); the decoder must not."""
    decoder = make_decoder(fmt, columns=arrow_schema({"id": "bigint", "v": "double"}))
    if fmt == "debezium-json":
        messages = [change("c", after={"id": 1, "v": -0.0}), change("c", after={"id": 2, "v": True})]
    else:
        messages = [{"database": "shop", "table": "t", "type": "insert", "ts": 1, "data": {"id": i, "v": v}}
                    for i, v in ((1, -0.0), (2, True))]
    out = decoder.decode(records(messages))
    assert out.rows.column("id").to_pylist() == [1]
    assert [d["reason"] for d in out.dead_letters.to_pylist()] == ["schema-mismatch"]
    assert "column 'v'" in out.dead_letters.column("error")[0].as_py()
