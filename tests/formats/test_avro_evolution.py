"""Debezium Avro writer schemas that change: added columns evolve, incompatible changes quarantine."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.formats.debezium_avro import DebeziumAvroDecoder
from tests.formats.avro_envelopes import V1, V2_ADDS_EMAIL, V3_NAME_IS_LONG, V4_DROPS_ID, envelope, framed
from tests.formats.helpers import records

pytestmark = pytest.mark.unit

SCHEMAS = {1: V1, 2: V2_ADDS_EMAIL, 3: V3_NAME_IS_LONG, 4: V4_DROPS_ID,
           5: envelope([{"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}])}


def _decoder() -> DebeziumAvroDecoder:
    return DebeziumAvroDecoder(schema_lookup=SCHEMAS.__getitem__)


def test_a_new_writer_schema_adds_its_column_and_older_rows_read_null() -> None:
    decoder = _decoder()
    first = decoder.decode(records([framed(1, V1, "c", pos=1, after={"id": 1, "name": "a"})]))
    assert first.rows.column_names[:2] == ["id", "name"] and "email" not in first.rows.column_names
    mixed = decoder.decode(records([framed(1, V1, "c", pos=2, after={"id": 2, "name": "b"}),
                                    framed(2, V2_ADDS_EMAIL, "c", pos=3, after={"id": 3, "name": "c", "email": "c@x"})]))
    assert decoder.columns.names == ["id", "name", "email"]
    assert mixed.rows.select(["id", "email"]).to_pylist() == [{"id": 2, "email": None}, {"id": 3, "email": "c@x"}]
    assert mixed.dead_letters.num_rows == 0 and decoder.incompatible is None


def test_a_narrower_type_is_read_into_the_known_type() -> None:
    decoder = _decoder()
    decoder.decode(records([framed(1, V1, "c", pos=1, after={"id": 1, "name": "a"})]))
    out = decoder.decode(records([framed(5, SCHEMAS[5], "c", pos=2, after={"id": 2, "name": "b"})]))
    assert out.rows.schema.field("id").type == pa.int64() and out.rows["id"].to_pylist() == [2]
    assert decoder.incompatible is None


@pytest.mark.parametrize(("schema_id", "what"), [(3, "column 'name' changed from string to int64"),
                                                 (4, "column 'id' was removed")])
def test_an_incompatible_schema_quarantines_the_batch_and_every_later_message(schema_id, what) -> None:
    decoder = _decoder()
    decoder.decode(records([framed(1, V1, "c", pos=1, after={"id": 1, "name": "a"})]))
    after = {"id": 3, "name": 7} if schema_id == 3 else {"sku": "x", "name": "n"}
    batch = records([framed(1, V1, "c", pos=2, after={"id": 2, "name": "b"}),
                     framed(schema_id, SCHEMAS[schema_id], "c", pos=3, after=after)])
    out = decoder.decode(batch)
    assert out.rows.num_rows == 0
    assert out.dead_letters["reason"].to_pylist() == ["schema-incompatible"] * 2
    assert out.dead_letters["value"].to_pylist() == batch["value"].to_pylist()      # raw bytes kept
    error = out.dead_letters["error"][0].as_py()
    assert what in error and "declare the source's columns" in error
    later = decoder.decode(records([framed(1, V1, "c", pos=4, after={"id": 4, "name": "d"}), None]))
    assert later.rows.num_rows == 0 and later.dead_letters["reason"].to_pylist() == ["schema-incompatible"]
    assert later.skipped == {"tombstone": 1}


def test_after_a_restart_the_first_schema_is_checked_against_the_table() -> None:
    decoder = _decoder()
    decoder.adopt_table(pa.schema([("id", pa.int64()), ("name", pa.string())]), ("id",))
    out = decoder.decode(records([framed(3, V3_NAME_IS_LONG, "c", pos=1, after={"id": 1, "name": 5})]))
    assert out.rows.num_rows == 0 and "column 'name' changed" in out.dead_letters["error"][0].as_py()
    fresh = _decoder()
    fresh.adopt_table(pa.schema([("id", pa.int64()), ("name", pa.string())]), ("id",))
    ok = fresh.decode(records([framed(2, V2_ADDS_EMAIL, "c", pos=1, after={"id": 1, "name": "a", "email": "e"})]))
    assert ok.rows.select(["id", "email"]).to_pylist() == [{"id": 1, "email": "e"}]
