"""Debezium Avro writer schemas that change: the decoder reads every column seen so far (widened types
widened) and lists the batch's writer schemas; the table's schema_change behaviour decides the rest
(tests/sink/test_schema_change.py, tests/integration/test_schema_evolution.py)."""

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
    assert mixed.dead_letters.num_rows == 0
    assert [s.names for s in decoder.source_schemas] == [["id", "name"], ["id", "name", "email"]]


def test_a_narrower_type_is_read_into_the_known_type_and_a_wider_one_widens_it() -> None:
    decoder = _decoder()
    decoder.decode(records([framed(5, SCHEMAS[5], "c", pos=1, after={"id": 1, "name": "a"})]))
    assert decoder.columns.field("id").type == pa.int32()
    out = decoder.decode(records([framed(1, V1, "c", pos=2, after={"id": 2**40, "name": "b"})]))
    assert out.rows.schema.field("id").type == pa.int64() and out.rows["id"].to_pylist() == [2**40]
    back = decoder.decode(records([framed(5, SCHEMAS[5], "c", pos=3, after={"id": 3, "name": "c"})]))
    assert back.rows.schema.field("id").type == pa.int64() and back.rows["id"].to_pylist() == [3]
    assert decoder.source_schemas[0].field("id").type == pa.int32()     # what the writer says, for the table


def test_a_dropped_column_reads_null_and_the_batch_lists_the_schema_without_it() -> None:
    decoder = _decoder()
    decoder.decode(records([framed(1, V1, "c", pos=1, after={"id": 1, "name": "a"})]))
    out = decoder.decode(records([framed(4, V4_DROPS_ID, "c", pos=2, after={"sku": "x", "name": "n"})]))
    assert out.rows.select(["id", "name", "sku"]).to_pylist() == [{"id": None, "name": "n", "sku": "x"}]
    assert [s.names for s in decoder.source_schemas] == [["sku", "name"]]
