"""Debezium Avro envelopes with a chosen row record, and Confluent-framed change messages."""

from __future__ import annotations

import io
import struct

import fastavro

SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql", "fields": [
    {"name": "ts_ms", "type": "long"}, {"name": "db", "type": "string"},
    {"name": "table", "type": ["null", "string"], "default": None}, {"name": "file", "type": "string"},
    {"name": "pos", "type": "long"}, {"name": "row", "type": "int"}]}


def envelope(row_fields: list[dict], *, namespace: str = "shop.items") -> dict:
    row = {"type": "record", "name": "Value", "namespace": namespace, "fields": row_fields}
    return {"type": "record", "name": "Envelope", "namespace": namespace, "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": SOURCE}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def framed(schema_id: int, schema: dict, op: str, *, pos: int, before: dict | None = None,
           after: dict | None = None) -> bytes:
    """A Confluent-framed Debezium change (MySQL source at binlog position ``pos``)."""
    src = {"ts_ms": 1_700_000_000_000 + pos, "db": "shop", "table": "items", "file": "mysql-bin.000003",
           "pos": pos, "row": 0}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema),
                               {"before": before, "after": after, "source": src, "op": op, "ts_ms": 1})
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


ID = {"name": "id", "type": "long"}
NAME = {"name": "name", "type": ["null", "string"], "default": None}
EMAIL = {"name": "email", "type": ["null", "string"], "default": None}
V1 = envelope([ID, NAME])
V2_ADDS_EMAIL = envelope([ID, NAME, EMAIL])
V3_NAME_IS_LONG = envelope([ID, {"name": "name", "type": ["null", "long"], "default": None}])
V4_DROPS_ID = envelope([{"name": "sku", "type": "string"}, NAME])


KEY = {"type": "record", "name": "Key", "namespace": "shop.items", "fields": [ID]}


def framed_key(schema_id: int, key: int) -> bytes:
    """A Confluent-framed Avro message key {id}."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(KEY), {"id": key})
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()
