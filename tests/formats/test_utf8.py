"""A decoder never emits an invalid string (issue #11, item 3).

Bytes that are not UTF-8 anywhere in a message (a string value, a field name, a
field the decoder ignores, the source block) make the message a ``malformed``
dead letter with its raw bytes, on every path: Debezium JSON in bulk (Arrow's JSON
reader, which does not check strings in nested objects) and message by message,
with and without the schema envelope, Debezium Avro through polars and fastavro,
Canal, Maxwell and OGG.
"""

from __future__ import annotations

import orjson
import pytest

from changelake.formats import make_decoder
from changelake.formats.debezium_avro import DebeziumAvroDecoder
from changelake.formats.sqltypes import sql_schema
from tests.formats.avro_envelopes import V1, framed
from tests.formats.helpers import change, records

pytestmark = pytest.mark.unit

COLUMNS = sql_schema([("id", "BIGINT NOT NULL"), ("name", "STRING")])
BAD = b"\xff"        # never valid in UTF-8
OVERLONG = b"\xc0\xaf"   # an overlong '/', rejected by strict decoders
SURROGATE = b"\xed\xa0\x80"   # an encoded UTF-16 surrogate, not valid UTF-8


def valid_strings(result) -> None:
    result.rows.validate(full=True)   # raises on an invalid UTF-8 string anywhere in the rows


def corrupt(message: bytes, marker: bytes, bad: bytes) -> bytes:
    assert message.count(marker) == 1
    return message.replace(marker, marker[:1] + bad + marker[2:])


def debezium(after: dict, **source) -> bytes:
    msg = change("c", after=after)
    msg["source"].update(source)
    return orjson.dumps(msg)


PLACES = {
    "string value": debezium({"id": 2, "name": "QQQQ"}),
    "field name": debezium({"id": 2, "name": "a", "QQQQ": 1}),
    "ignored field's value": debezium({"id": 2, "name": "a", "extra": "QQQQ"}),
    "source table": debezium({"id": 2, "name": "a"}, table="QQQQ"),
    "source connector": debezium({"id": 2, "name": "a"}, connector="QQQQ"),
}


@pytest.mark.parametrize("bad", [BAD, OVERLONG, SURROGATE], ids=["ff", "overlong", "surrogate"])
@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "inferred"])
def test_debezium_json_bulk_and_per_message(place: str, bad: bytes, declared: bool) -> None:
    good = [debezium({"id": i, "name": f"n{i}"}) for i in range(5)]
    message = corrupt(PLACES[place], b"QQQQ", bad)
    decoder = make_decoder("debezium-json", columns=COLUMNS if declared else None)
    decoder.decode(records(good))            # columns known: the next chunk may take the bulk path
    assert decoder._bulk_plan() is not None
    result = decoder.decode(records([*good, message, *good]))
    valid_strings(result)
    assert result.rows.num_rows == 10
    assert result.dead_letters.column("reason").to_pylist() == ["malformed"]
    letter = result.dead_letters.to_pylist()[0]
    assert letter["value"] == message and letter["offset"] == 105
    assert "not valid UTF-8" in letter["error"] and "position" in letter["error"]


def test_debezium_json_envelope() -> None:
    schema = {"type": "struct", "fields": [
        {"type": "struct", "field": "before", "optional": True, "fields": [
            {"type": "int64", "field": "id"}, {"type": "string", "optional": True, "field": "name"}]},
        {"type": "struct", "field": "after", "optional": True, "fields": [
            {"type": "int64", "field": "id"}, {"type": "string", "optional": True, "field": "name"}]},
        {"type": "string", "field": "op"}]}

    def wrapped(i: int, name: str) -> bytes:
        return orjson.dumps({"schema": schema, "payload": change("c", after={"id": i, "name": name})})

    good = [wrapped(i, f"n{i}") for i in range(4)]
    message = corrupt(wrapped(9, "QQQQ"), b"QQQQ", BAD)
    for options in ({"schema-include": True}, {}):
        decoder = make_decoder("debezium-json", columns=COLUMNS, options=options)
        decoder.decode(records(good))
        result = decoder.decode(records([*good, message]))
        valid_strings(result)
        assert result.rows.num_rows == 4
        assert result.dead_letters.column("value").to_pylist() == [message]


def test_escaped_lone_surrogate_is_malformed() -> None:
    # valid UTF-8 bytes, but the JSON escape names half a surrogate pair: no Unicode string has it
    message = debezium({"id": 2, "name": "QQQQ"}).replace(b"QQQQ", b"\\ud800")
    result = make_decoder("debezium-json", columns=COLUMNS).decode(records([message]))
    assert result.dead_letters.column("reason").to_pylist() == ["malformed"]


def test_debezium_avro_bulk_and_per_message() -> None:
    good = [framed(1, V1, "c", pos=i, after={"id": i, "name": f"n{i}"}) for i in range(5)]
    in_value = corrupt(framed(1, V1, "c", pos=7, after={"id": 7, "name": "QQQQ"}), b"QQQQ", BAD)
    in_source = framed(1, V1, "c", pos=8, after={"id": 8, "name": "n"}).replace(b"shop", b"s\xffop")
    for columns in (COLUMNS, None):
        decoder = DebeziumAvroDecoder(columns=columns, schema_lookup={1: V1}.__getitem__)
        result = decoder.decode(records([*good, in_value, in_source, *good]))
        valid_strings(result)
        assert result.rows.num_rows == 10
        assert result.dead_letters.column("value").to_pylist() == [in_value, in_source]
        assert set(result.dead_letters.column("reason").to_pylist()) == {"malformed"}
        assert all("not valid UTF-8" in e for e in result.dead_letters.column("error").to_pylist())


OTHERS = {
    "canal-json": {"data": [{"id": "1", "name": "QQQQ"}], "old": None, "database": "db", "table": "t",
                   "type": "INSERT", "isDdl": False, "es": 1, "ts": 2},
    "maxwell-json": {"database": "db", "table": "t", "type": "insert", "ts": 1, "data": {"id": 1, "name": "QQQQ"}},
    "ogg-json": {"table": "S.T", "op_type": "I", "op_ts": "2024-01-01 00:00:00.000000", "pos": "1",
                 "after": {"id": 1, "name": "QQQQ"}},
}


@pytest.mark.parametrize("fmt", sorted(OTHERS))
@pytest.mark.parametrize("where", ["value", "key"])
def test_canal_maxwell_ogg(fmt: str, where: str) -> None:
    good = orjson.dumps(OTHERS[fmt]).replace(b"QQQQ", b"ok")
    text = orjson.dumps(OTHERS[fmt])
    message = corrupt(text.replace(b'"name"', b'"QQQQ"').replace(b'"QQQQ":"QQQQ"', b'"QQQQ":"ok"'),
                      b"QQQQ", BAD) if where == "key" else corrupt(text, b"QQQQ", BAD)
    for columns in (COLUMNS, None):
        result = make_decoder(fmt, columns=columns).decode(records([good, message, good]))
        valid_strings(result)
        assert result.rows.num_rows == 2
        assert result.dead_letters.column("value").to_pylist() == [message]
        assert result.dead_letters.column("reason").to_pylist() == ["malformed"]
