"""make_decoder: format names, option validation, column type names."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import RAW_SCHEMA
from changelake.errors import ConfigError
from changelake.formats import FORMATS, make_decoder
from changelake.formats.sqltypes import sql_schema, sql_type

pytestmark = pytest.mark.unit

COLUMNS = sql_schema([("id", "INT NOT NULL"), ("name", "STRING")])


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_builds_and_rejects_unknown_options(fmt: str) -> None:
    base = {"url": "http://registry:8081"} if fmt == "debezium-avro-confluent" else {}
    decoder = make_decoder(fmt, columns=COLUMNS, options=base)
    assert decoder.columns == COLUMNS
    with pytest.raises(ConfigError) as err:
        make_decoder(fmt, columns=COLUMNS, options={**base, "bogus": 1})
    assert "'bogus'" in str(err.value) and "allowed options" in str(err.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefixed_and_underscored_keys_are_the_same_option(fmt: str) -> None:
    base = {"url": "http://registry:8081"} if fmt == "debezium-avro-confluent" else {}
    a = make_decoder(fmt, columns=COLUMNS, options={**base, f"{fmt}.key": "id"})
    b = make_decoder(fmt, columns=COLUMNS, options={**base, "KEY": ["id"]})
    assert a._key == b._key == ("id",)


def test_key_must_name_a_column() -> None:
    with pytest.raises(ConfigError, match="not among the columns"):
        make_decoder("debezium-json", columns=COLUMNS, options={"key": "uid"})


def test_metadata_column_may_not_shadow_a_user_column() -> None:
    with pytest.raises(ConfigError, match="clash"):
        make_decoder("canal-json", columns=COLUMNS, options={"metadata": {"table": "name"}})


def test_format_option_must_match() -> None:
    with pytest.raises(ConfigError, match="'format'"):
        make_decoder("canal-json", options={"format": "debezium-json"})


def test_invalid_regex_names_the_option() -> None:
    with pytest.raises(ConfigError, match="database.include"):
        make_decoder("canal-json", options={"database.include": "(["})


def test_columns_must_be_an_arrow_schema() -> None:
    with pytest.raises(ConfigError, match="pyarrow.Schema"):
        make_decoder("debezium-json", columns=[("id", "INT")])


@pytest.mark.parametrize("text, expected", [
    ("INT NOT NULL", pa.int32()), ("decimal(38, 10)", pa.decimal128(38, 10)),
    ("TIMESTAMP(9)", pa.timestamp("ns")), ("TIMESTAMP_LTZ(3)", pa.timestamp("ms", tz="UTC")),
    ("MAP<STRING, ARRAY<INT>>", pa.map_(pa.string(), pa.list_(pa.int32()))), ("TIME(6)", pa.time64("us")),
])
def test_sql_types(text: str, expected: pa.DataType) -> None:
    assert sql_type(text) == expected


@pytest.mark.parametrize("text", ["GEOMETRY", "DECIMAL(40, 2)", "INT(", "MAP<INT>"])
def test_unsupported_sql_types(text: str) -> None:
    with pytest.raises(ConfigError, match="unsupported|MAP type"):
        sql_type(text)


def test_not_null_makes_a_non_nullable_field() -> None:
    assert [f.nullable for f in COLUMNS] == [False, True]


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_schema_is_the_schema_of_the_rows(fmt: str) -> None:
    options = {"url": "http://registry:8081"} if fmt == "debezium-avro-confluent" else {}
    options["metadata"] = {"debezium-json": ["source.table"], "debezium-avro-confluent": ["source.table"],
                           "canal-json": ["table"], "maxwell-json": ["table"], "ogg-json": ["table"]}[fmt]
    decoder = make_decoder(fmt, columns=COLUMNS, options=options)
    empty = decoder.decode(RAW_SCHEMA.empty_table())
    assert decoder.output_schema == empty.rows.schema
    assert decoder.output_schema.names[:3] == ["id", "name", options["metadata"][0]]
    assert make_decoder("debezium-json").output_schema is None
