"""Debezium JSON decoding rules beyond Flink's test corpus."""

from __future__ import annotations

import base64
import datetime as dt
import decimal

import pyarrow as pa
import pytest

from changelake.changelog import METADATA_NAMES, seq_from_kafka, seq_from_log_position
from changelake.errors import ConfigError
from changelake.formats import make_decoder
from changelake.formats.debezium import sequence
from changelake.formats.sqltypes import sql_schema
from tests.formats.helpers import change, kinds, mysql_source, pg_source, records

pytestmark = pytest.mark.unit

COLUMNS = sql_schema([("id", "INT NOT NULL"), ("name", "STRING"), ("price", "DOUBLE")])


def decode(values, columns=COLUMNS, **options):
    return make_decoder("debezium-json", columns=columns, options=options).decode(records(values))


def test_output_is_user_columns_then_reserved_columns() -> None:
    out = decode([change("c", after={"id": 1, "name": "a", "price": 1.5})]).rows
    assert out.column_names == ["id", "name", "price", *METADATA_NAMES]
    row = out.to_pylist()[0]
    assert row["_topic"] == "shop.products" and row["_partition"] == 2 and row["_offset"] == 100
    assert row["_db"] == "shop" and row["_table"] == "products"
    assert row["_source_ts"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)


def test_seq_from_mysql_binlog_postgres_lsn_or_kafka() -> None:
    out = decode([change("c", after={"id": 1}),
                  change("c", after={"id": 2}, source=pg_source()),
                  change("c", after={"id": 3}, source={"connector": "mongodb"})]).rows
    assert out.column("_seq").to_pylist() == [
        seq_from_log_position(3, 154, 1, offset=100),
        seq_from_log_position(34078720, offset=101),
        seq_from_kafka(2, 102),
    ]


def test_inline_seq_matches_contract() -> None:
    src = mysql_source(file="mysql-bin.012345", pos=987654321, row=7)
    assert sequence(src, 3, 42) == seq_from_log_position(12345, 987654321, 7, offset=42)
    assert sequence(mysql_source(row=None), 0, 1) == seq_from_log_position(3, 154, 0, offset=1)


def test_seq_orders_binlog_positions_across_files() -> None:
    older = sequence(mysql_source(file="mysql-bin.000009", pos=999_999), 0, 5)
    newer = sequence(mysql_source(file="mysql-bin.000010", pos=4), 0, 1)
    assert older < newer


def test_update_emits_before_then_after() -> None:
    out = decode([change("u", before={"id": 1, "name": "a", "price": 1.0},
                         after={"id": 1, "name": "b", "price": 2.0})]).rows
    assert kinds(out) == ["-U", "+U"]
    assert out.column("name").to_pylist() == ["a", "b"]


def test_update_without_before_is_a_dead_letter_that_says_what_to_fix() -> None:
    msg = change("u", after={"id": 1, "name": "b", "price": 2.0}, source=pg_source())
    result = decode([msg])
    assert result.rows.num_rows == 0
    dead = result.dead_letters.to_pylist()[0]
    assert dead["reason"] == "missing-before"
    assert "set REPLICA IDENTITY FULL on the table, or declare the source as upsert" in dead["error"]
    assert dead["key"] == b"k0" and dead["offset"] == 100 and dead["topic"] == "shop.products"


def test_upsert_source_emits_only_update_after() -> None:
    msg = change("u", after={"id": 1, "name": "b", "price": 2.0}, source=pg_source())
    result = decode([msg], upsert=True)
    assert kinds(result.rows) == ["+U"] and result.dead_letters.num_rows == 0


def test_delete_without_before_is_a_dead_letter_even_for_upsert() -> None:
    result = decode([change("d")], upsert="true")
    assert result.dead_letters.column("reason").to_pylist() == ["missing-before"]


@pytest.mark.parametrize("policy", ["skip", "apply"])
def test_truncate_is_reported_at_its_log_position(policy) -> None:
    result = decode([change("t", source=mysql_source(pos=900, row=0)), change("t", source=pg_source())],
                    on_truncate=policy)
    assert result.rows.num_rows == 0 and result.dead_letters.num_rows == 0 and not result.skipped
    got = result.truncates.to_pylist()
    assert [t["_seq"] for t in got] == [sequence(mysql_source(pos=900, row=0), 2, 100), sequence(pg_source(), 2, 101)]
    assert [(t["_db"], t["_table"], t["offset"]) for t in got] == [("shop", "products", 100), ("postgres", "orders", 101)]


def test_truncate_can_fail_naming_its_position() -> None:
    result = decode([change("t")], on_truncate="fail")
    dead = result.dead_letters.to_pylist()[0]
    assert dead["reason"] == "unsupported" and "on_truncate" in dead["error"]
    assert sequence(mysql_source(), 2, 100) in dead["error"] and "shop.products" in dead["error"]


def test_logical_decoding_messages_are_skipped_and_counted() -> None:
    msg = {"op": "m", "ts_ms": 1, "source": pg_source(), "message": {"prefix": "x", "content": "eA=="}}
    assert decode([msg]).skipped == {"message": 1}


def test_unknown_op() -> None:
    dead = decode([change("x", after={"id": 1})]).dead_letters.to_pylist()[0]
    assert dead["reason"] == "unknown-op" and "'x'" in dead["error"]


def test_create_without_after_is_malformed() -> None:
    assert decode([change("c")]).dead_letters.column("reason").to_pylist() == ["malformed"]


@pytest.mark.parametrize("raw", [b'{"op":"c","after":{"id":1}', b"\xff\xfe\x00garbage", b"[1, 2]", b'"text"', b"42"])
def test_unparseable_values_keep_their_bytes(raw: bytes) -> None:
    result = decode([raw])
    dead = result.dead_letters.to_pylist()[0]
    assert dead["reason"] == "malformed" and dead["value"] == raw and dead["error"]


def test_tombstones_produce_nothing_and_are_counted() -> None:
    result = decode([None, b"", {"schema": None, "payload": None}])
    assert result.rows.num_rows == 0 and result.dead_letters.num_rows == 0
    assert result.skipped == {"tombstone": 3}


def test_value_that_does_not_fit_the_declared_type_rejects_the_whole_message(monkeypatch) -> None:
    good = change("c", after={"id": 1, "name": "a", "price": 1.0})
    bad = change("u", before={"id": 2, "name": "a", "price": 1.0}, after={"id": 2, "name": "a", "price": "cheap"})
    result = decode([good, bad, good])
    assert result.rows.column("_offset").to_pylist() == [100, 102]
    dead = result.dead_letters.to_pylist()[0]
    assert dead["reason"] == "schema-mismatch" and dead["offset"] == 101
    # the error names the column; the value stays out of it (it can reach a log) unless row values are on
    assert "'price'" in dead["error"] and "cheap" not in dead["error"] and "<str, 5 chars>" in dead["error"]
    monkeypatch.setenv("CHANGELAKE_LOG_ROW_VALUES", "1")
    assert "'cheap'" in decode([bad]).dead_letters.to_pylist()[0]["error"]


@pytest.mark.parametrize("value", [1.5, True, 2**40, "12x", {"n": 1}])
def test_integer_column_rejects_non_integers(value) -> None:
    result = decode([change("c", after={"id": value})])
    assert result.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


def test_not_null_column_without_value_is_rejected() -> None:
    result = decode([change("c", after={"name": "no id"})])
    assert result.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


def test_key_column_without_value_is_missing_key() -> None:
    columns = sql_schema([("id", "INT"), ("name", "STRING")])
    result = decode([change("c", after={"name": "x"})], columns=columns, key=["id"])
    assert result.dead_letters.column("reason").to_pylist() == ["missing-key"]


def test_numbers_in_string_columns_are_kept_as_text() -> None:
    out = decode([change("c", after={"id": 1, "name": 42, "price": 1})]).rows
    assert out.column("name").to_pylist() == ["42"] and out.column("price").to_pylist() == [1.0]


def _envelope(fields: list[dict], after: dict, op: str = "c") -> dict:
    row = {"type": "struct", "fields": fields, "optional": True, "name": "shop.products.Value"}
    schema = {"type": "struct", "name": "shop.products.Envelope", "optional": False, "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "fields": [], "optional": False, "field": "source"},
        {"type": "string", "optional": False, "field": "op"}]}
    return {"schema": schema, "payload": {"before": None, "after": after, "source": mysql_source(), "op": op}}


SEMANTIC_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal",
     "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}], "field": "ratio"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "at"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "at_ms"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "zoned"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "field": "tod"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "field": "uid"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "field": "state"},
    {"type": "bytes", "optional": True, "name": "io.debezium.data.Bits", "field": "bits"},
    {"type": "boolean", "optional": True, "field": "flag"},
    {"type": "int16", "optional": True, "field": "small"},
    {"type": "float32", "optional": True, "field": "f"},
]
SEMANTIC_ROW = {
    "id": 7, "price": base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode(),
    "ratio": {"scale": 3, "value": base64.b64encode((-1500).to_bytes(2, "big", signed=True)).decode()},
    "day": 19000, "at": 1_700_000_000_123_456, "at_ms": 1_700_000_000_123,
    "zoned": "2023-11-14T22:13:20.5+01:00", "tod": 3_600_000_001, "doc": '{"a": 1}',
    "uid": "0b8e1a52-4a4f-4a43-9d1e-6f0a1a2b3c4d", "state": "shipped",
    "bits": base64.b64encode(b"\x05").decode(), "flag": True, "small": -3, "f": 0.5,
}


def test_connect_schema_types_become_arrow_types() -> None:
    decoder = make_decoder("debezium-json", options={"schema-include": True})
    out = decoder.decode(records([_envelope(SEMANTIC_FIELDS, SEMANTIC_ROW)]))
    assert out.dead_letters.num_rows == 0, out.dead_letters.to_pylist()
    types = {f.name: f.type for f in decoder.columns}
    assert types == {
        "id": pa.int32(), "price": pa.decimal128(10, 2), "ratio": pa.string(), "day": pa.date32(),
        "at": pa.timestamp("us"), "at_ms": pa.timestamp("ms"), "zoned": pa.timestamp("us", tz="UTC"),
        "tod": pa.time64("us"), "doc": pa.string(), "uid": pa.string(), "state": pa.string(),
        "bits": pa.binary(), "flag": pa.bool_(), "small": pa.int16(), "f": pa.float32()}
    row = out.rows.to_pylist()[0]
    assert row["price"] == decimal.Decimal("123.45")
    assert row["ratio"] == "-1.500"
    assert row["day"] == dt.date(2022, 1, 8)
    assert row["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row["at_ms"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert row["zoned"] == dt.datetime(2023, 11, 14, 21, 13, 20, 500000, tzinfo=dt.timezone.utc)
    assert row["tod"] == dt.time(1, 0, 0, 1)
    assert row["bits"] == b"\x05" and row["small"] == -3 and row["flag"] is True


def test_declared_columns_read_with_the_envelope_encoding() -> None:
    columns = sql_schema([("id", "BIGINT"), ("price", "DECIMAL(12, 2)"), ("at", "TIMESTAMP(3)")])
    decoder = make_decoder("debezium-json", columns=columns)
    out = decoder.decode(records([_envelope(SEMANTIC_FIELDS, SEMANTIC_ROW)])).rows.to_pylist()[0]
    assert out["price"] == decimal.Decimal("123.45")
    assert out["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)


def test_schema_include_requires_the_envelope() -> None:
    decoder = make_decoder("debezium-json", columns=COLUMNS, options={"schema-include": True})
    dead = decoder.decode(records([change("c", after={"id": 1})])).dead_letters.to_pylist()[0]
    assert dead["reason"] == "malformed" and "schema-include" in dead["error"]


def test_inferred_columns_are_deterministic_and_then_fixed() -> None:
    batch = [change("c", after={"id": 1, "score": 1, "name": "a", "ok": True, "mixed": 1}),
             change("c", after={"id": 2, "score": 2.5, "name": None, "ok": False, "mixed": "x"})]
    first = make_decoder("debezium-json")
    second = make_decoder("debezium-json")
    a, b = first.decode(records(batch)), second.decode(records(batch))
    assert a.rows.equals(b.rows)
    assert [(f.name, f.type) for f in first.columns] == [
        ("id", pa.int64()), ("score", pa.float64()), ("name", pa.string()), ("ok", pa.bool_()),
        ("mixed", pa.string())]
    assert a.rows.column("mixed").to_pylist() == ["1", "x"]
    later = first.decode(records([change("c", after={"id": 3, "score": "bad"})]))
    assert later.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


def test_metadata_columns_follow_user_columns_with_chosen_names() -> None:
    decoder = make_decoder("debezium-json", columns=COLUMNS, options={
        "metadata": {"source.table": "src_table", "ingestion-timestamp": "ingested_at"}})
    out = decoder.decode(records([change("c", after={"id": 1})])).rows
    assert out.column_names[:5] == ["id", "name", "price", "src_table", "ingested_at"]
    assert out.column("src_table").to_pylist() == ["products"]


@pytest.mark.parametrize("options, needle", [
    ({"no-such-option": 1}, "allowed options"),
    ({"on_truncate": "drop"}, "[apply, skip, fail]"),
    ({"upsert": "yes"}, "Unrecognized option for boolean: yes"),
    ({"metadata": ["source.nope"]}, "allowed keys"),
    ({"metadata": {"source.table": "_table"}}, "reserved"),
])
def test_invalid_options(options, needle) -> None:
    with pytest.raises(ConfigError) as err:
        make_decoder("debezium-json", columns=COLUMNS, options=options)
    assert needle in str(err.value)


def test_unknown_format_lists_the_formats() -> None:
    with pytest.raises(ConfigError, match="canal-json"):
        make_decoder("protobuf")


@pytest.mark.parametrize("fmt", ["debezium-json", "canal-json", "maxwell-json", "ogg-json"])
def test_decoders_survive_pickling_after_use(fmt: str) -> None:
    """Spark ships decoders to executors by pickling them, after the driver may have used them."""
    import pickle

    decoder = make_decoder(fmt, columns=COLUMNS, options={"key": ["id"]})
    batch = records([change("c", after={"id": 1, "name": "a", "price": 1.0})] * 3)
    first = decoder.decode(batch)
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.decode(batch).rows.equals(first.rows)


def test_declared_columns_with_envelope_use_its_units_on_every_path() -> None:
    fields = [{"type": "int32", "optional": False, "field": "id"},
              {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "at"}]
    columns = sql_schema([("id", "INT NOT NULL"), ("at", "TIMESTAMP(3)")])
    decoder = make_decoder("debezium-json", columns=columns, options={"schema-include": True})
    batch = records([_envelope(fields, {"id": i, "at": 1_700_000_000_123_456}) for i in range(3)])
    for _ in range(2):   # the second batch may take the bulk path
        out = decoder.decode(batch).rows.column("at").to_pylist()
        assert out == [dt.datetime(2023, 11, 14, 22, 13, 20, 123000)] * 3


@pytest.mark.parametrize("chunk", ["healthy", "mixed"])
def test_float_beyond_float_range_is_a_schema_mismatch_not_infinity(chunk) -> None:
    """A FLOAT (float32) column rounds a JSON number to the nearest float, as Java writes
    Float.MAX_VALUE (3.4028235E38, a double just above it); a finite number that would round to
    infinity does not fit. Both the bulk path (a healthy chunk) and the per-message path."""
    columns = sql_schema([("id", "INT NOT NULL"), ("f", "FLOAT")])
    values = [3.4028235e38, -3.4028235e38, 1.4e-45, -0.0, 3.4028236e38, -1e300]
    messages = [change("c", after={"id": i, "f": v}) for i, v in enumerate(values)]
    if chunk == "mixed":
        messages.append(b"not json")
    result = decode(messages, columns=columns)
    assert result.rows.select(["id", "f"]).to_pylist() == [
        {"id": 0, "f": 3.4028234663852886e38}, {"id": 1, "f": -3.4028234663852886e38},
        {"id": 2, "f": 1.401298464324817e-45}, {"id": 3, "f": -0.0}]
    mismatched = [r for r in result.dead_letters.to_pylist() if r["reason"] == "schema-mismatch"]
    assert [r["offset"] for r in mismatched] == [104, 105]
    assert all("column 'f'" in r["error"] and "FLOAT's range" in r["error"] for r in mismatched)


def test_a_boolean_after_a_number_in_a_double_column_is_a_schema_mismatch() -> None:
    """Arrow's type inference reads [1.5, true] as doubles (true as 1.0); the boolean must still
    be a dead letter (found by tests/formats/test_fuzz.py)."""
    columns = sql_schema([("id", "INT NOT NULL"), ("dbl", "DOUBLE")])
    result = decode([change("c", after={"id": 0, "dbl": -0.0}), change("c", after={"id": 1, "dbl": True}),
                     b"not json"], columns=columns)
    assert result.rows.select(["id", "dbl"]).to_pylist() == [{"id": 0, "dbl": -0.0}]
    assert [(r["offset"], r["reason"]) for r in result.dead_letters.to_pylist()] == \
        [(101, "schema-mismatch"), (102, "malformed")]
