"""Every schema_change behaviour, for Debezium JSON with schema, schema-less Debezium JSON and Debezium
Avro with a schema registry, through Kafka, Spark and Delta in one pipeline of 15 tables.

Each table gets 4 changes of its first schema (id, qty int, note), committed, then, in a later batch of
the same processor (its decoders keep what they learnt), 4 changes of a second schema: qty widened to
bigint (two values beyond 2^31), email added, note dropped. Schema-less JSON cannot widen (its numbers are
bigint from the start) nor drop (an absent field is just absent): there the change is the added field.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.config import ChangelakeConfig
from changelake.service.pipeline import BatchProcessor
from changelake.service.query_start import start_query
from tests.formats.avro_envelopes import envelope, framed
from tests.integration.test_schema_evolution import change, field
from tests.registry_stub import schema_registry

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.kafka]

BEHAVIOURS = ("evolve", "try_evolve", "lenient", "ignore", "exception")
FORMATS = ("schema", "schemaless", "avro")
BIG = 2**40
FIRST = [{"id": i, "qty": i, "note": f"n{i}"} for i in range(1, 5)]
SECOND = [{"id": i, "qty": BIG + i if i % 2 else i, "email": f"e{i}"} for i in range(5, 9)]
JSON_V1 = [field("id", "int32", False), field("qty", "int32"), field("note", "string")]
JSON_V2 = [field("id", "int32", False), field("qty", "int64"), field("email", "string")]
AVRO_V1 = envelope([{"name": "id", "type": "int"}, {"name": "qty", "type": ["null", "int"], "default": None},
                    {"name": "note", "type": ["null", "string"], "default": None}])
AVRO_V2 = envelope([{"name": "id", "type": "int"}, {"name": "qty", "type": ["null", "long"], "default": None},
                    {"name": "email", "type": ["null", "string"], "default": None}])


def _value(fmt: str, second: bool, after: dict) -> bytes:
    pos = after["id"]
    if fmt == "schema":
        return change(JSON_V2 if second else JSON_V1, after, pos)
    if fmt == "schemaless":
        return orjson.dumps({"op": "c", "before": None, "after": after,
                             "source": {"file": "mysql-bin.000001", "pos": pos}})
    return framed(2 if second else 1, AVRO_V2 if second else AVRO_V1, "c", pos=pos, after=after)


def _produce(servers: str, prefix: str, second: bool) -> None:
    p = Producer({"bootstrap.servers": servers, "log_level": 3})
    for fmt in FORMATS:
        for b in BEHAVIOURS:
            for after in SECOND if second else FIRST:
                p.produce(f"{prefix}.{fmt}.{b}", key=b'{"id": %d}' % after["id"], value=_value(fmt, second, after),
                          partition=0)
    p.flush(30)


def _expected(fmt: str, behaviour: str) -> tuple[dict[str, pa.DataType], dict[int, dict], set[int], set[int]]:
    """(table columns -> type, rows by id, ids dead-lettered schema-incompatible, ids schema-mismatch)."""
    first = {r["id"]: dict(r) for r in FIRST}
    if fmt == "schemaless":
        types = {"id": pa.int64(), "qty": pa.int64(), "note": pa.string()}
        if behaviour == "exception":
            return types, first, {r["id"] for r in SECOND}, set()
        if behaviour == "ignore":
            return types, first | {r["id"]: {"id": r["id"], "qty": r["qty"], "note": None} for r in SECOND}, set(), set()
        types["email"] = pa.string()
        return types, ({k: v | {"email": None} for k, v in first.items()}
                       | {r["id"]: {**r, "note": None} for r in SECOND}), set(), set()
    types = {"id": pa.int32(), "qty": pa.int32(), "note": pa.string()}
    if behaviour == "exception":
        return types, first, {r["id"] for r in SECOND}, set()
    if behaviour == "ignore":
        fits = [r for r in SECOND if r["qty"] < BIG]
        return (types, first | {r["id"]: {"id": r["id"], "qty": r["qty"], "note": None} for r in fits}, set(),
                {r["id"] for r in SECOND if r["qty"] >= BIG})
    types.update(qty=pa.int64(), email=pa.string())
    rows = {k: v | {"email": None} for k, v in first.items()} | {r["id"]: {**r, "note": None} for r in SECOND}
    if behaviour == "evolve":
        rows[9] = {"id": 9, "qty": 9, "email": "e9", "note": None}
    if behaviour in ("evolve", "try_evolve"):       # the dropped column leaves the table
        del types["note"]
        rows = {k: {c: v for c, v in r.items() if c != "note"} for k, r in rows.items()}
    return types, rows, set(), set()


def test_every_behaviour_for_every_format(spark, kafka, tmp_path):
    prefix = kafka.topic("behaviours")
    with schema_registry({1: AVRO_V1, 2: AVRO_V2}) as (url, _):
        sources, tables = [], []
        for fmt in FORMATS:
            options = {"schema-include": True} if fmt == "schema" else {"url": url} if fmt == "avro" else {}
            for b in BEHAVIOURS:
                name = f"{fmt}_{b}"
                sources.append({"name": name, "topics": [f"{prefix}.{fmt}.{b}"], "table": name,
                                "format": "debezium-avro-confluent" if fmt == "avro" else "debezium-json",
                                "options": options, "schema_change": b})
                tables.append({"name": name, "primary_key": ["id"]})
        config = ChangelakeConfig.model_validate({
            "pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "ckpt")},
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "sources": sources, "tables": tables, "storage": {"root": str(tmp_path / "lake")}})
        processor = BatchProcessor(config, spark=spark)
        _produce(kafka.bootstrap_servers, prefix, second=False)
        start_query(spark, config, processor, available_now=True).awaitTermination()
        _produce(kafka.bootstrap_servers, prefix, second=True)
        start_query(spark, config, processor, available_now=True).awaitTermination()
        p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
        for fmt in ("schema", "avro"):       # a later batch: the dropped column stays dropped
            p.produce(f"{prefix}.{fmt}.evolve", key=b'{"id": 9}', partition=0,
                      value=_value(fmt, True, {"id": 9, "qty": 9, "email": "e9"}))
        p.flush(30)
        start_query(spark, config, processor, available_now=True).awaitTermination()

    letters = read_delta(config.dead_letter_path())
    problems = []
    for fmt in FORMATS:
        for b in BEHAVIOURS:
            name = f"{fmt}_{b}"
            types, rows, incompatible, mismatch = _expected(fmt, b)
            table = read_delta(config.table_path(name))
            got_types = {f.name: f.type for f in table.schema if not f.name.startswith("_")}
            got_rows = {r["id"]: {c: r[c] for c in types} for r in table.to_pylist()}
            mine = letters.filter(pa.compute.equal(letters["topic"], f"{prefix}.{fmt}.{b}"))
            by_reason = {}
            for r in mine.to_pylist():
                by_reason.setdefault(r["reason"], set()).add(r["offset"] + 1)     # offsets 0.. hold ids 1..
            if got_types != types:
                problems.append(f"{name}: columns {got_types} != {types}")
            if got_rows != rows:
                problems.append(f"{name}: rows {got_rows} != {rows}")
            if by_reason.get("schema-incompatible", set()) != incompatible or \
                    by_reason.get("schema-mismatch", set()) != mismatch:
                problems.append(f"{name}: dead letters {by_reason}")
    assert not problems, "\n".join(problems)
    assert set(processor.quarantine.tables) == {f"{fmt}_exception" for fmt in FORMATS}
