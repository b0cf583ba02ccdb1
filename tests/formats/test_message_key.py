"""Field names of Kafka message keys, and tables whose primary key is learnt from them."""

from __future__ import annotations

import io
import struct

import fastavro
import orjson
import pytest

from changelake.errors import DecodeError
from changelake.formats.debezium_avro import DebeziumAvroDecoder
from changelake.formats.message_key import key_fields, key_shapes
from changelake.service.config import parse_config
from changelake.service.key_inference import TableKeys
from tests.formats.helpers import records

pytestmark = pytest.mark.unit

KEY_SCHEMA = {"type": "record", "name": "Key", "namespace": "shop.orders",
              "fields": [{"name": "shop", "type": "string"}, {"name": "id", "type": "long"}]}


def _avro_key(schema_id: int, value: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(KEY_SCHEMA), value)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def test_key_fields_of_every_debezium_key_form() -> None:
    envelope = {"schema": {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}, "payload": {"id": 1}}
    assert key_fields(orjson.dumps(envelope)) == ("id",)
    assert key_fields(b'{"a": 1, "b": "x"}') == ("a", "b")
    decoder = DebeziumAvroDecoder(schema_lookup={7: KEY_SCHEMA}.__getitem__)
    assert key_fields(_avro_key(7, {"shop": "s", "id": 3}), decoder) == ("shop", "id")
    assert decoder.columns is None          # a key schema is not mistaken for the row's writer schema
    for no_key in (None, b"", b"17", b'"k"', b"{}", b"not json", _avro_key(8, {"shop": "s", "id": 3})):
        assert key_fields(no_key, decoder) is None, no_key


def test_shapes_leave_tombstones_out_and_name_the_first_message() -> None:
    table = records([{"op": "c"}, None, {"op": "c"}, {"op": "c"}],
                    keys=[b'{"id": 1}', None, b'{"id": 2}', None])
    shapes = {r["fields"]: r for r in key_shapes(table).to_pylist()}
    assert shapes['["id"]']["messages"] == 2 and shapes['["id"]']["offset"] == 100
    assert shapes[None]["messages"] == 1 and shapes[None]["offset"] == 103


def test_shapes_leave_out_keyless_truncate_and_message_events() -> None:
    """Debezium's Postgres and MySQL connectors write a TRUNCATE (op t) and a logical decoding message (op m)
    with a null key, with or without the schema envelope: they carry no row, so they say nothing about the
    key (a table learnt its key wrongly or failed before). A keyless row change still counts."""
    truncate = {"op": "t", "source": {"connector": "postgresql", "lsn": 7}, "before": None, "after": None}
    table = records([{"op": "c"}, truncate, {"schema": {"type": "struct"}, "payload": truncate}, {"op": "m"},
                     {"op": "c"}], keys=[b'{"id": 1}', None, b"", None, None])
    shapes = {r["fields"]: r for r in key_shapes(table).to_pylist()}
    assert shapes['["id"]']["messages"] == 1
    assert shapes[None]["messages"] == 1 and shapes[None]["offset"] == 104
    assert key_shapes(records([truncate], keys=[None])).num_rows == 0


CONFIG = """
pipeline: {id: p, checkpoint: %(root)s/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources: [{name: a, topics: [a], table: a}]
tables: [{name: a}]
storage: {root: %(root)s/lake}
"""


def test_a_table_learns_one_key_and_refuses_keyless_or_disagreeing_messages(tmp_path) -> None:
    config = parse_config(CONFIG % {"root": tmp_path})
    keys = TableKeys(config)
    assert keys.unknown() == {"a"}
    with pytest.raises(DecodeError, match="has no key.*set tables\\[\\].primary_key"):
        keys.learn({"a": [key_shapes(records([{"op": "c"}, {"op": "c"}], keys=[b'{"id": 1}', None]))]})
    with pytest.raises(DecodeError, match="disagree"):
        keys.learn({"a": [key_shapes(records([{"op": "c"}, {"op": "c"}], keys=[b'{"id": 1}', b'{"uid": 1}']))]})
    assert keys.key_of("a") is None
    keys.learn({"a": [key_shapes(records([{"op": "c"}], keys=[b'{"id": 1, "region": "eu"}']))]})
    assert keys.key_of("a") == ("id", "region") and not keys.unknown()


@pytest.mark.parametrize("raw", [b'{"i\xffd": 1}', b'{"id": "\xff"}', b'{"schema": {}, "payload": {"\xc0\xafid": 1}}',
                                 b'{"id": "\\ud800"}', b"\xff\xfe", b"\x00\x00\x00"])
def test_a_key_that_is_not_utf8_json_has_no_fields(raw: bytes) -> None:
    """Such a key names no columns (the table then needs tables[].primary_key) and never raises;
    the message's value is decoded as usual and the key keeps its raw bytes in any dead letter."""
    assert key_fields(raw) is None
    shapes = key_shapes(records([{"op": "c"}], keys=[raw]))
    assert shapes.to_pylist()[0]["fields"] is None
