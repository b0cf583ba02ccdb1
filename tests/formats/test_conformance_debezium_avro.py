"""Flink's debezium-avro-confluent expectations (shared/conformance/formats/debezium-avro-confluent).

The registry is replaced by an injected schema lookup that serves
``debezium-test-schema.json`` under the id the messages carry (81).
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import fastavro
import pytest

from changelake.errors import ConfigError
from changelake.formats import make_decoder
from changelake.formats.debezium_avro import DebeziumAvroDecoder
from changelake.formats.sqltypes import sql_schema
from tests.formats import conformance as cf

FORMAT = "debezium-avro-confluent"
pytestmark = pytest.mark.unit


def _lookup(directory: Path, calls: list[int]):
    text = (directory / "debezium-test-schema.json").read_text()

    def lookup(schema_id: int) -> str:
        calls.append(schema_id)
        if schema_id != 81:
            raise KeyError(schema_id)
        return text

    return lookup


@pytest.mark.parametrize("path", cf.case_params(FORMAT))
def test_case(path: Path) -> None:
    case = cf.load(path)
    calls: list[int] = []
    decoder = DebeziumAvroDecoder(columns=sql_schema(case["schema"]), options={"subject": "testDebeziumAvro"},
                                  schema_lookup=_lookup(path.parent, calls))
    if case["input_file"] is None:
        # serialize-then-deserialize: the bytes a before/after/op writer produces (written here with
        # fastavro: changelake has no Avro encoder), framed with a schema id the lookup serves
        writer = _writer_schema_for(case["schema"])
        values = [_frame(7, writer, {"before": None, "after": dict(zip([c[0] for c in case["schema"]], r["row"])),
                                     "op": "c"}) for r in case["input_rows"]]
        decoder = DebeziumAvroDecoder(columns=sql_schema(case["schema"]), options={},
                                      schema_lookup=lambda i: {7: writer}[i])
    else:
        values = cf.input_values(case, path.parent)
    result = decoder.decode(cf.raw_records(values + values))   # twice: the schema is fetched once
    assert result.dead_letters.num_rows == 0, result.dead_letters.to_pylist()
    expected = cf.expected_changelog(case["expected"], case["schema"])
    assert cf.changelog(result.rows, case["schema"]) == expected + expected
    assert len(calls) <= 1


def _writer_schema_for(columns: list[list[str]]) -> dict:
    avro = {"BIGINT": "long", "STRING": "string", "DOUBLE": "double"}
    row = {"type": "record", "name": "Row", "fields": [
        {"name": n, "type": ["null", avro[t.split()[0]]], "default": None} for n, t in columns]}
    return {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Row"], "default": None},
        {"name": "op", "type": ["null", "string"], "default": None}]}


def _frame(schema_id: int, schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(json.dumps(schema))), record)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def test_needs_url_without_lookup() -> None:
    with pytest.raises(ConfigError, match="'url'"):
        make_decoder(FORMAT)


def test_registry_client_is_built_from_url() -> None:
    decoder = make_decoder(FORMAT, options={"url": "http://registry:8081", "subject": "s"})
    assert decoder.url == "http://registry:8081"
