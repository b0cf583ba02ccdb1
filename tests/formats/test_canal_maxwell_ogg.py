"""Canal, Maxwell and OGG rules beyond Flink's test corpus."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from changelake.changelog import seq_from_kafka, seq_from_log_position
from changelake.formats import make_decoder
from changelake.formats.sqltypes import sql_schema
from tests.formats.helpers import kinds, records

pytestmark = pytest.mark.unit


def canal(kind: str, data, old=None, **extra) -> dict:
    return {"data": data, "old": old, "database": "shop", "table": "orders", "type": kind, "isDdl": False,
            "es": 1_700_000_000_000, "ts": 1_700_000_000_500, "pkNames": ["id"],
            "mysqlType": {"id": "bigint(20) unsigned", "amount": "decimal(10,2)", "at": "datetime(3)",
                          "qty": "int(11)", "note": "varchar(64)", "day": "date", "ok": "tinyint(1)",
                          "raw": "varbinary(8)"},
            "sqlType": {"id": -5, "amount": 3, "at": 93, "qty": 4, "note": 12, "day": 91, "ok": -6, "raw": -3},
            **extra}


ROW = {"id": "18446744073709551615", "amount": "12.50", "at": "2024-01-02 03:04:05.678", "qty": "-3",
       "note": None, "day": "2024-02-29", "ok": "1", "raw": "\u00ff\u0001"}


def test_canal_types_come_from_mysql_type() -> None:
    decoder = make_decoder("canal-json")
    out = decoder.decode(records([canal("INSERT", [ROW])]))
    assert out.dead_letters.num_rows == 0, out.dead_letters.to_pylist()
    assert dict(zip(decoder.columns.names, decoder.columns.types)) == {
        "id": pa.decimal128(20, 0), "amount": pa.decimal128(10, 2), "at": pa.timestamp("ms"), "qty": pa.int32(),
        "note": pa.string(), "day": pa.date32(), "ok": pa.int8(), "raw": pa.binary()}
    row = out.rows.to_pylist()[0]
    assert row["id"] == decimal.Decimal("18446744073709551615")
    assert row["amount"] == decimal.Decimal("12.50")
    assert row["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678000)
    assert row["qty"] == -3 and row["day"] == dt.date(2024, 2, 29) and row["ok"] == 1
    assert row["raw"] == b"\xff\x01"
    assert row["_db"] == "shop" and row["_table"] == "orders"
    assert row["_seq"] == seq_from_kafka(2, 100)


def test_canal_update_merges_old_into_each_row() -> None:
    columns = sql_schema([("id", "INT"), ("qty", "INT"), ("note", "STRING")])
    data = [{"id": "1", "qty": "5", "note": "a"}, {"id": "2", "qty": "7", "note": "b"}]
    old = [{"qty": "4"}, {"note": None}]
    out = make_decoder("canal-json", columns=columns).decode(records([canal("UPDATE", data, old)])).rows
    assert kinds(out) == ["-U", "+U", "-U", "+U"]
    assert out.select(["id", "qty", "note"]).to_pylist() == [
        {"id": 1, "qty": 4, "note": "a"}, {"id": 1, "qty": 5, "note": "a"},
        {"id": 2, "qty": 7, "note": None}, {"id": 2, "qty": 7, "note": "b"}]


def test_canal_include_filters_match_whole_names_and_are_counted() -> None:
    columns = sql_schema([("id", "INT")])
    decoder = make_decoder("canal-json", columns=columns,
                           options={"database.include": "shop", "table.include": "order"})
    result = decoder.decode(records([canal("INSERT", [{"id": "1"}]),
                                     canal("INSERT", [{"id": "2"}], table="order")]))
    assert result.rows.column("id").to_pylist() == [2]
    assert result.skipped == {"filtered": 1}


def test_canal_ddl_is_counted_and_truncate_is_reported_with_its_position() -> None:
    columns = sql_schema([("id", "INT")])
    # Canal writes a TRUNCATE as a DDL entry: isDdl true, type TRUNCATE, no data
    msgs = [{"data": None, "database": "shop", "table": "orders", "type": "ALTER", "isDdl": True, "sql": "..."},
            canal("TRUNCATE", None, isDdl=True, sql="TRUNCATE TABLE orders")]
    result = make_decoder("canal-json", columns=columns).decode(records(msgs))
    assert result.skipped == {"ddl": 1} and result.rows.num_rows == 0 and result.dead_letters.num_rows == 0
    assert result.truncates.to_pylist() == [{"topic": "shop.products", "partition": 2, "offset": 101,
                                             "_seq": seq_from_kafka(2, 101), "_db": "shop", "_table": "orders"}]
    failing = make_decoder("canal-json", columns=columns, options={"on_truncate": "fail"})
    dead = failing.decode(records(msgs)).dead_letters.to_pylist()
    assert [d["reason"] for d in dead] == ["unsupported"]
    assert "shop.orders" in dead[0]["error"] and seq_from_kafka(2, 101) in dead[0]["error"]


def test_canal_text_that_is_not_a_number_is_a_schema_mismatch() -> None:
    columns = sql_schema([("id", "INT"), ("qty", "INT")])
    result = make_decoder("canal-json", columns=columns).decode(
        records([canal("INSERT", [{"id": "1", "qty": "many"}, {"id": "2", "qty": "3"}])]))
    assert result.rows.num_rows == 0   # one bad row rejects its whole message
    assert result.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]


def test_canal_update_without_matching_old_is_missing_before() -> None:
    columns = sql_schema([("id", "INT")])
    result = make_decoder("canal-json", columns=columns).decode(records([canal("UPDATE", [{"id": "1"}], None)]))
    assert result.dead_letters.column("reason").to_pylist() == ["missing-before"]


def maxwell(kind: str, data, old=None, **extra) -> dict:
    return {"database": "shop", "table": "orders", "type": kind, "ts": 1_700_000_000, "xid": 9, "xoffset": 2,
            "data": data, "old": old, **extra}


def test_maxwell_update_seq_and_timestamp() -> None:
    columns = sql_schema([("id", "INT"), ("qty", "INT")])
    msg = maxwell("update", {"id": 1, "qty": 5}, {"qty": 4}, position="mysql-bin.000012:4567")
    out = make_decoder("maxwell-json", columns=columns).decode(records([msg, maxwell("insert", {"id": 2})])).rows
    assert kinds(out) == ["-U", "+U", "+I"]
    assert out.column("qty").to_pylist() == [4, 5, None]
    assert out.column("_seq").to_pylist() == [seq_from_log_position(12, 4567, 2, offset=100)] * 2 + [
        seq_from_kafka(2, 101)]
    assert out.column("_source_ts").to_pylist()[0] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.timezone.utc)


def test_maxwell_bootstrap_rows_and_markers() -> None:
    columns = sql_schema([("id", "INT")])
    result = make_decoder("maxwell-json", columns=columns).decode(records([
        maxwell("bootstrap-start", {}), maxwell("bootstrap-insert", {"id": 1}), maxwell("bootstrap-complete", {}),
        maxwell("table-create", {})]))
    assert kinds(result.rows) == ["+I"]
    assert result.skipped == {"bootstrap-marker": 2}
    assert result.dead_letters.column("reason").to_pylist() == ["unknown-op"]


def ogg(op: str, before=None, after=None, **extra) -> dict:
    return {"table": "SALES.ORDERS", "op_type": op, "op_ts": "2024-01-02 03:04:05.000000",
            "current_ts": "2024-01-02T03:04:06.123456", "pos": "00000000020000001234", "before": before,
            "after": after, **extra}


def test_ogg_positions_and_names() -> None:
    columns = sql_schema([("id", "INT"), ("qty", "INT")])
    out = make_decoder("ogg-json", columns=columns).decode(records([ogg("U", {"id": 1, "qty": 1},
                                                                         {"id": 1, "qty": 2})])).rows
    row = out.to_pylist()[0]
    assert kinds(out) == ["-U", "+U"]
    assert row["_seq"] == seq_from_log_position(20000001234, offset=100)
    assert row["_db"] == "SALES" and row["_table"] == "ORDERS"
    assert row["_source_ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def test_ogg_update_without_before_needs_upsert() -> None:
    columns = sql_schema([("id", "INT")])
    msg = ogg("U", None, {"id": 1})
    assert make_decoder("ogg-json", columns=columns).decode(records([msg])).dead_letters.column(
        "reason").to_pylist() == ["missing-before"]
    assert kinds(make_decoder("ogg-json", columns=columns, options={"upsert": True}).decode(
        records([msg])).rows) == ["+U"]


def test_ogg_truncate_and_unknown() -> None:
    columns = sql_schema([("id", "INT")])
    result = make_decoder("ogg-json", columns=columns).decode(records([ogg("T"), ogg("Z", after={"id": 1})]))
    assert not result.skipped and result.rows.num_rows == 0
    assert result.truncates.to_pylist() == [{"topic": "shop.products", "partition": 2, "offset": 100,
                                             "_seq": seq_from_log_position(20000001234, offset=100),
                                             "_db": "SALES", "_table": "ORDERS"}]
    assert result.dead_letters.column("reason").to_pylist() == ["unknown-op"]


def test_canal_float_text_beyond_float_range_is_a_schema_mismatch() -> None:
    columns = sql_schema([("id", "INT"), ("f", "FLOAT")])
    result = make_decoder("canal-json", columns=columns).decode(records([
        canal("INSERT", [{"id": "1", "f": "3.4028235E38"}]), canal("INSERT", [{"id": "2", "f": "3.4028236E38"}])]))
    assert result.rows.select(["id", "f"]).to_pylist() == [{"id": 1, "f": 3.4028234663852886e38}]
    assert result.dead_letters.column("reason").to_pylist() == ["schema-mismatch"]
