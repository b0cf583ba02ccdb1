"""Debezium Avro: registry access, caching, Connect types in Avro, bad framing."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import pickle
import struct

import fastavro
import pyarrow as pa
import pytest

from changelake.changelog import seq_from_log_position
from changelake.errors import SourceError
from changelake.formats import make_decoder
from changelake.formats.debezium_avro import DebeziumAvroDecoder
from tests.formats.helpers import kinds, mysql_source, records
from tests.registry_stub import schema_registry

pytestmark = pytest.mark.unit

ROW = {"type": "record", "name": "Value", "namespace": "shop.orders", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": ["null", {"type": "bytes", "scale": 2, "precision": 10,
                                         "connect.version": 1, "connect.parameters": {"scale": "2"},
                                         "connect.name": "org.apache.kafka.connect.data.Decimal",
                                         "logicalType": "decimal"}], "default": None},
    {"name": "at", "type": ["null", {"type": "long", "connect.version": 1,
                                     "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
    {"name": "day", "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date",
                                      "logicalType": "date"}], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None}]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql", "fields": [
    {"name": "ts_ms", "type": "long"}, {"name": "db", "type": "string"},
    {"name": "table", "type": ["null", "string"], "default": None}, {"name": "file", "type": "string"},
    {"name": "pos", "type": "long"}, {"name": "row", "type": "int"}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.orders", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": SOURCE}, {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
PARSED = fastavro.parse_schema(json.loads(json.dumps(ENVELOPE)))


def frame(schema_id: int, op: str, before=None, after=None) -> bytes:
    src = {k: v for k, v in mysql_source().items() if k in ("ts_ms", "db", "table", "file", "pos", "row")}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, PARSED, {"before": before, "after": after, "source": src, "op": op,
                                             "ts_ms": 1})
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


AFTER = {"id": 5, "amount": decimal.Decimal("12.34"), "at": 1_700_000_000_123_456, "day": dt.date(2024, 2, 29),
         "note": "x"}


@pytest.fixture()
def registry():
    """A minimal Confluent Schema Registry that serves schema 42."""
    with schema_registry({42: ENVELOPE}) as served:
        yield served


def test_registry_schemas_are_fetched_once_and_unknown_ids_are_dead_letters(registry) -> None:
    url, hits = registry
    decoder = make_decoder("debezium-avro-confluent", options={"url": url})
    result = decoder.decode(records([frame(42, "c", after=AFTER), frame(42, "u", before=AFTER, after=AFTER),
                                     frame(77, "c", after=AFTER)]))
    assert kinds(result.rows) == ["+I", "-U", "+U"]
    assert result.dead_letters.column("reason").to_pylist() == ["malformed"]
    assert "schema id 77" in result.dead_letters.column("error")[0].as_py()
    assert sum("/schemas/ids/42" in h for h in hits) == 1
    again = decoder.decode(records([frame(42, "d", before=AFTER)]))
    assert kinds(again.rows) == ["-D"] and sum("/schemas/ids/42" in h for h in hits) == 1


def test_unreachable_registry_raises_instead_of_dropping_data() -> None:
    decoder = make_decoder("debezium-avro-confluent", options={"url": "http://127.0.0.1:9"})
    with pytest.raises(SourceError, match="Schema Registry"):
        decoder.decode(records([frame(42, "c", after=AFTER)]))


def test_connect_types_in_avro() -> None:
    decoder = DebeziumAvroDecoder(schema_lookup={42: ENVELOPE}.__getitem__)
    out = decoder.decode(records([frame(42, "c", after=AFTER)]))
    assert dict(zip(decoder.columns.names, decoder.columns.types)) == {
        "id": pa.int64(), "amount": pa.decimal128(10, 2), "at": pa.timestamp("us"), "day": pa.date32(),
        "note": pa.string()}
    row = out.rows.to_pylist()[0]
    assert row["amount"] == decimal.Decimal("12.34")
    assert row["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row["day"] == dt.date(2024, 2, 29)
    assert row["_seq"] == seq_from_log_position(3, 154, 1, offset=100)
    assert row["_db"] == "shop" and row["_table"] == "products"


@pytest.mark.parametrize("raw", [b"\x01\x00\x00\x00\x2a\x02", b"\x00\x00", b"{\"op\":\"c\"}"])
def test_bad_framing_is_malformed(raw: bytes) -> None:
    decoder = DebeziumAvroDecoder(schema_lookup={42: ENVELOPE}.__getitem__)
    dead = decoder.decode(records([raw])).dead_letters.to_pylist()[0]
    assert dead["reason"] == "malformed" and dead["value"] == raw


def test_truncated_body_is_malformed() -> None:
    decoder = DebeziumAvroDecoder(schema_lookup={42: ENVELOPE}.__getitem__)
    raw = frame(42, "c", after=AFTER)[:12]
    assert decoder.decode(records([raw])).dead_letters.column("reason").to_pylist() == ["malformed"]


def test_decoder_pickles_without_its_registry_client(registry) -> None:
    url, _ = registry
    decoder = make_decoder("debezium-avro-confluent", options={"url": url})
    decoder.decode(records([frame(42, "c", after=AFTER)]))
    clone = pickle.loads(pickle.dumps(decoder))
    assert kinds(clone.decode(records([frame(42, "c", after=AFTER)])).rows) == ["+I"]


def _bench_decoder():
    from bench import gen
    schema = gen.avro_envelope_schema()
    return gen, DebeziumAvroDecoder(columns=gen.SCHEMA, schema_lookup=lambda _id: schema,
                                    options={"metadata": ["source.table", "ingestion-timestamp"]})


def test_bulk_path_matches_the_per_message_path() -> None:
    pytest.importorskip("polars", reason="the Avro bulk path needs the optional polars package")
    gen, decoder = _bench_decoder()
    table = gen.records(gen.debezium_avro(2000) + [None])
    decoder.decode(table.slice(0, 1))
    bulk = decoder._bulk(table)
    assert bulk is not None, "the bulk path declined a healthy chunk"
    slow = decoder._decode(table)
    assert bulk.rows.schema == slow.rows.schema
    assert bulk.rows.to_pylist() == slow.rows.to_pylist()
    assert bulk.skipped == slow.skipped == {"tombstone": 1}


def test_shifted_message_boundaries_are_caught() -> None:
    pytest.importorskip("polars", reason="the Avro bulk path needs the optional polars package")
    gen, decoder = _bench_decoder()
    values = gen.debezium_avro(50)
    values[20] = values[20][:-2]           # truncated ...
    values[21] = values[21] + b"\x00\x00"  # ... and the next one two bytes longer: same total length
    table = gen.records(values)
    decoder.decode(table.slice(0, 1))
    assert decoder._bulk(table) is None
    result = decoder.decode(table)
    assert result.dead_letters.column("offset").to_pylist() == [20]
    assert len(set(result.rows.column("_offset").to_pylist())) == 49


def test_a_batch_mixing_writer_schemas_reads_each_message_with_its_own_encodings() -> None:
    """Declared columns took the encodings of the batch's last message for every message: a
    MicroTimestamp column read as milliseconds after a message of another writer schema."""
    from tests.formats.avro_envelopes import envelope, framed

    micro = envelope([{"name": "id", "type": "long"},
                      {"name": "at", "type": {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}}])
    milli = envelope([{"name": "id", "type": "long"},
                      {"name": "at", "type": {"type": "long", "connect.name": "io.debezium.time.Timestamp"}}])
    columns = pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us"))])
    decoder = DebeziumAvroDecoder(columns=columns, schema_lookup={1: micro, 2: milli}.__getitem__)
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 678000)
    messages = [framed(1, micro, "c", pos=1, after={"id": 1, "at": 1_704_164_645_678_000}),
                framed(2, milli, "c", pos=2, after={"id": 2, "at": 1_704_164_645_678}),
                framed(1, micro, "c", pos=3, after={"id": 3, "at": 1_704_164_645_678_000}),
                b"\x00\x00\x00\x00\x09\x00"]   # an unknown schema id last
    out = decoder._decode(records(messages))
    assert out.rows.column("at").to_pylist() == [at, at, at]
    assert out.rows.column("id").to_pylist() == [1, 2, 3]
    assert out.dead_letters.column("reason").to_pylist() == ["malformed"]
