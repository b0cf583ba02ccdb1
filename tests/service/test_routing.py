"""Routing a source's changes to tables named from each change's own table, in process: decode stage ->
driver -> delta-rs sinks (no JVM, no broker)."""

from __future__ import annotations

import json

import orjson
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from changelake import metrics
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink_schema import PROP_PRIMARY_KEY
from changelake.errors import ConfigError
from changelake.formats.origin import NoOrigin, Origin, OriginReader
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED
from tests.routed_history import RoutedDatabase

pytestmark = pytest.mark.unit

DDL = 0.2
SHARDS = {f"orders_{i}": (i, 4) for i in range(4)}
EVENTS = {f"events_{i}": (1, 1) for i in range(2)}      # the same ids in every shard
PLAIN = {f"t{i}": (1, 1) for i in range(3)}


def _config(tmp_path, route: list[dict], **source) -> object:
    raw = {"pipeline": {"id": f"route-{tmp_path.name}", "checkpoint": str(tmp_path / "ckpt")},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")},
           "sources": [{"name": "shop", "topic_pattern": r"srv\.shop\..*", "route": route, **source}]}
    return parse_config(yaml.safe_dump(raw))


RULES = [
    {"source_table": r"shop\.orders_\d+", "table": "orders", "partition_by": ["flag"]},
    {"source_table": r"shop\.(events)_\d+", "table": "$1", "origin_columns": True},
    {"source_table": r"shop\.(.*)", "table": "shop_<>", "replace_symbol": "<>",
     "properties": {"delta.enableChangeDataFeed": "true"}},
]


def _records(messages, first_offset: int = 0) -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_pydict({
        "topic": [m.topic for m in messages], "partition": [0] * n,
        "offset": list(range(first_offset, first_offset + n)), "timestamp": [1_700_000_000_000] * n,
        "key": [m.key for m in messages], "value": [m.value for m in messages], EXPIRED: [0] * n},
        schema=ARROW_SCHEMA)


def _process(processor: BatchProcessor, batch_id: int, messages, first_offset: int = 0):
    out = pa.Table.from_batches(list(processor.stage(iter([_records(messages, first_offset)]))))
    return processor.process_decoded(out, batch_id)


def _table(path: str, key: list[str]) -> dict[tuple, dict]:
    rows = read_delta(path).to_pylist()
    return {tuple(r[k] for k in key): {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}


def test_origin_of_every_format():
    dbz = {"before": None, "after": {"id": 1}, "op": "c",
           "source": {"db": "shop", "schema": "public", "table": "orders"}}
    assert OriginReader("debezium-json").origin(orjson.dumps(dbz)).name == "shop.public.orders"
    wrapped = orjson.dumps({"schema": {}, "payload": {**dbz, "source": {"db": "shop", "table": "t"}}})
    assert OriginReader("debezium-json").origin(wrapped) == Origin("shop", None, "t")
    canal = {"database": "shop", "table": "orders_3", "type": "INSERT", "data": [{"id": "1"}]}
    assert OriginReader("canal-json").origin(orjson.dumps(canal)).name == "shop.orders_3"
    maxwell = {"database": "shop", "table": "items", "type": "insert", "data": {"id": 1}}
    assert OriginReader("maxwell-json").origin(orjson.dumps(maxwell)).name == "shop.items"
    ogg = {"table": "HR.EMPLOYEES", "op_type": "I", "after": {"ID": 1}}
    assert OriginReader("ogg-json").origin(orjson.dumps(ogg)) == Origin("HR", None, "EMPLOYEES")
    with pytest.raises(NoOrigin, match="names no source table") as no:
        OriginReader("debezium-json").origin(b'{"op": "c", "after": {"id": 1}}')
    assert no.value.reason == "unrouted"
    with pytest.raises(NoOrigin, match="not valid JSON") as no:
        OriginReader("canal-json").origin(b"{nope")
    assert no.value.reason == "malformed"


def test_a_database_is_routed_to_tables_created_on_first_sight(tmp_path):
    config = _config(tmp_path, RULES)
    db = RoutedDatabase(prefix="srv")
    messages = db.history({**SHARDS, **EVENTS, **PLAIN}, changes=150)
    processor = BatchProcessor(config, graph=None)
    half = len(messages) // 2
    _process(processor, 0, messages[:half])
    _process(processor, 1, messages[half:], first_offset=half)

    assert sorted(processor.routed_tables) == ["events", "orders", "shop_t0", "shop_t1", "shop_t2"]
    lake = tmp_path / "lake"
    assert _table(str(lake / "orders"), ["id"]) == db.expected(list(SHARDS))
    assert _table(str(lake / "events"), ["id", "source_db", "source_table"]) == db.expected(list(EVENTS),
                                                                                           origin=True)
    for t in PLAIN:
        assert _table(str(lake / f"shop_{t}"), ["id"]) == db.expected([t])
    # keys from the message keys (plus the origin columns), the rule's table settings
    meta = DeltaTable(str(lake / "events")).metadata()
    assert json.loads(meta.configuration[PROP_PRIMARY_KEY]) == ["id", "source_db", "source_table"]
    assert DeltaTable(str(lake / "orders")).metadata().partition_columns == ["flag"]
    assert DeltaTable(str(lake / "shop_t1")).metadata().configuration["delta.enableChangeDataFeed"] == "true"

    # a replayed batch writes nothing twice; a restarted process keeps the recorded keys
    again = BatchProcessor(config, graph=None)
    report = _process(again, 1, messages[half:], first_offset=half)
    assert report.committed_tables == []
    assert again.keys.key_of("events") == ("id", "source_db", "source_table")
    assert _table(str(lake / "orders"), ["id"]) == db.expected(list(SHARDS))


def test_unroutable_messages_are_dead_letters_of_their_table(tmp_path):
    config = _config(tmp_path, [{"source_table": r"shop\.(t\d)", "table": "$1"},
                                {"source_table": r"shop\.bad", "table": "_oops"}])
    db = RoutedDatabase(prefix="srv")
    good = db.history({"t1": (1, 1), "other": (1, 1), "bad": (1, 1)}, changes=0, redeliver=0)
    broken = db._message("t1", "u", 1, None, {"id": 1, "name": "x", "big": 1, "ratio": 1.0, "flag": True})
    junk = type(broken)("srv.shop.t1", None, b"{not json")
    before = metrics.REGISTRY.get_sample_value("changelake_table_bad_records_total",
                                               {"table": "t1", "reason": "missing-before", "action": "dlq"}) or 0
    processor = BatchProcessor(config, graph=None)
    report = _process(processor, 0, [*good, broken, junk])
    assert sorted(processor.routed_tables) == ["t1"]
    letters = read_delta(config.dead_letter_path()).to_pylist()
    by_reason = {}
    for letter in letters:
        by_reason.setdefault(letter["reason"], []).append(letter)
    assert [(r["table"], r["source"]) for r in by_reason["missing-before"]] == [("t1", "shop")]
    assert len(by_reason["unrouted"]) == 6             # 3 rows of 'other' (no rule), 3 of 'bad' (a bad name)
    assert {r["table"] for r in by_reason["unrouted"]} == {None}
    assert any("no route rule matches source table 'shop.other'" in r["error"] for r in by_reason["unrouted"])
    assert any("may not be empty, start with '_'" in r["error"] for r in by_reason["unrouted"])
    assert [r["offset"] for r in by_reason["malformed"]] == [10]
    assert report.dead_letters == {"unrouted": 6, "missing-before": 1, "malformed": 1}
    after = metrics.REGISTRY.get_sample_value("changelake_table_bad_records_total",
                                              {"table": "t1", "reason": "missing-before", "action": "dlq"})
    assert after - before == 1


def test_a_table_has_one_writer(tmp_path):
    config = _config(tmp_path, [{"source_table": r"shop\.a", "table": "x"}, {"source_table": r"shop\.b", "table": "x"}])
    db = RoutedDatabase(prefix="srv")
    processor = BatchProcessor(config, graph=None)
    report = _process(processor, 0, db.history({"a": (1, 1), "b": (1, 1)}, changes=0, redeliver=0))
    assert report.changes == {"x": {"+I": 3}} and report.dead_letters == {"unrouted": 3}
    letter = read_delta(config.dead_letter_path()).to_pylist()[0]
    assert "which source 'shop' route[0] writes" in letter["error"]


def test_keyless_source_tables_wait_in_the_dead_letters_while_the_others_go_on(tmp_path):
    config = _config(tmp_path, [{"source_table": r"shop\.(.*)", "table": "$1"}])
    db = RoutedDatabase(prefix="srv")
    messages = db.history({"keyed": (1, 1), "keyless": (1, 1)}, changes=0, redeliver=0)
    for m in messages:
        if m.topic.endswith("keyless"):
            m.key = None
    processor = BatchProcessor(config, graph=None)
    report = _process(processor, 0, messages)
    assert report.changes == {"keyed": {"+I": 3}} and report.dead_letters == {"missing-key": 3}
    assert "its route rule's primary_key" in read_delta(config.dead_letter_path()).to_pylist()[0]["error"]


def test_route_configuration_errors_name_what_to_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"refers to \$2, but source_table .* has 1 capture group"):
        _config(tmp_path, [{"source_table": r"shop\.(.*)", "table": "$2"}])
    with pytest.raises(ConfigError, match="not both"):
        _config(tmp_path, [{"source_table": ".*", "table": "t"}], table="x")
    with pytest.raises(ConfigError, match=r"declares columns per route rule"):
        _config(tmp_path, [{"source_table": ".*", "table": "t"}], columns={"id": "bigint"})
    with pytest.raises(ConfigError, match="source_table is not a valid regular expression"):
        _config(tmp_path, [{"source_table": "(", "table": "t"}])


def test_the_routing_example_of_the_docs_creates_the_tables_it_describes(tmp_path):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    section = doc[doc.index("## Routing a database"):]
    example = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL).group(1)
    config = parse_config(yaml.safe_dump({
        "pipeline": {"id": "docs-route", "checkpoint": str(tmp_path / "ckpt")},
        "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")}})
        + example, environ={})

    def change(table: str, pos: int, row: dict):
        source = {"db": "shop", "table": table, "file": "mysql-bin.000001", "pos": pos, "row": 0, "ts_ms": 1}
        value = {"op": "c", "before": None, "after": row, "source": source}
        return type("M", (), {"topic": f"dbserver1.shop.{table}", "key": orjson.dumps({"id": row["id"]}),
                              "value": orjson.dumps(value)})

    processor = BatchProcessor(config, graph=None)
    _process(processor, 0, [change("orders_3", 10, {"id": 3, "total": 5}), change("orders_7", 11, {"id": 7, "total": 1}),
                            change("events_0", 12, {"id": 1, "what": "a"}), change("events_1", 13, {"id": 1, "what": "b"}),
                            change("customers", 14, {"id": 9, "region": "eu"})])
    lake = tmp_path / "lake"
    assert sorted(processor.routed_tables) == ["events", "orders", "shop_customers"]
    assert sorted(_table(str(lake / "orders"), ["id"])) == [(3,), (7,)]
    assert DeltaTable(str(lake / "orders")).metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert sorted(_table(str(lake / "events"), ["id", "source_table"])) == [(1, "events_0"), (1, "events_1")]
    assert DeltaTable(str(lake / "shop_customers")).metadata().partition_columns == ["region"]
    assert processor.routed_tables["shop_customers"].maintenance.vacuum_retention == "14 days"


def test_a_dead_letter_topic_message_names_its_table():
    from changelake.connectors.dead_letter_topic import header_dict, letter_headers

    letter = {"reason": "missing-before", "error": "e", "topic": "t", "partition": 0, "offset": 5, "source": "shop",
              "table": "shop_t07"}
    assert header_dict(letter_headers(letter, pipeline_id="p", batch_id=1))["table"] == "shop_t07"
    assert "table" not in header_dict(letter_headers({**letter, "table": None}, pipeline_id="p", batch_id=1))


def test_debezium_avro_is_routed_by_the_source_table_of_each_record(tmp_path):
    import io
    import struct

    import fastavro

    from tests.formats.avro_envelopes import ID, KEY, NAME, SOURCE, envelope, framed_key
    from tests.registry_stub import schema_registry

    schemas = {1: envelope([ID, NAME], namespace="srv.shop.items"), 2: envelope([ID], namespace="srv.shop.users"),
               3: KEY}

    def change(schema_id: int, table: str, pos: int, row: dict):
        buf = io.BytesIO()
        source = {"ts_ms": 1, "db": "shop", "table": table, "file": "mysql-bin.000003", "pos": pos, "row": 0}
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schemas[schema_id]),
                                   {"before": None, "after": row, "source": source, "op": "c", "ts_ms": 1})
        return type("M", (), {"topic": f"srv.shop.{table}", "key": framed_key(3, row["id"]),
                              "value": b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()})

    assert SOURCE["fields"][2]["name"] == "table"
    with schema_registry(schemas) as (url, _):
        config = _config(tmp_path, [{"source_table": r"shop\.(.*)", "table": "$1"}],
                         format="debezium-avro-confluent", options={"url": url})
        processor = BatchProcessor(config, graph=None)
        report = _process(processor, 0, [change(1, "items", 10, {"id": 1, "name": "a"}),
                                         change(2, "users", 11, {"id": 7}), change(1, "items", 12, {"id": 2, "name": None})])
    assert report.changes == {"items": {"+I": 2}, "users": {"+I": 1}}
    lake = tmp_path / "lake"
    assert _table(str(lake / "items"), ["id"]) == {(1,): {"id": 1, "name": "a"}, (2,): {"id": 2, "name": None}}
    assert _table(str(lake / "users"), ["id"]) == {(7,): {"id": 7}}


def test_a_routed_table_takes_an_added_column_under_its_schema_change_behaviour(tmp_path):
    config = _config(tmp_path, [{"source_table": r"shop\.(.*)", "table": "$1", "origin_columns": True}])

    def change(pos: int, row: dict):
        fields = [{"field": k, "type": "int64" if k == "id" else "string", "optional": k != "id"} for k in row]
        schema = {"type": "struct", "fields": [{"field": "before", "type": "struct", "optional": True, "fields": fields},
                                               {"field": "after", "type": "struct", "optional": True, "fields": fields}]}
        source = {"db": "shop", "table": "people", "file": "mysql-bin.000001", "pos": pos, "row": 0, "ts_ms": 1}
        value = {"schema": schema, "payload": {"op": "c", "before": None, "after": row, "source": source}}
        return type("M", (), {"topic": "srv.shop.people", "key": orjson.dumps({"id": row["id"]}),
                              "value": orjson.dumps(value)})

    processor = BatchProcessor(config, graph=None)
    _process(processor, 0, [change(10, {"id": 1, "name": "a"})])
    _process(processor, 1, [change(11, {"id": 2, "name": "b", "email": "b@x"})], first_offset=1)
    again = BatchProcessor(config, graph=None)         # a restart: the decoder starts from the table's columns
    _process(again, 2, [change(12, {"id": 3, "name": "c", "email": "c@x"})], first_offset=2)
    assert _table(str(tmp_path / "lake" / "people"), ["id"]) == {
        (1,): {"id": 1, "name": "a", "source_db": "shop", "source_table": "people", "email": None},
        (2,): {"id": 2, "name": "b", "source_db": "shop", "source_table": "people", "email": "b@x"},
        (3,): {"id": 3, "name": "c", "source_db": "shop", "source_table": "people", "email": "c@x"}}


def test_a_routed_database_whose_columns_change_over_lagging_partitions_equals_the_source(tmp_path):
    """ADD, widen and DROP COLUMN mid-stream, topics of 4 partitions by key, re-deliveries, batches that take a
    few messages of each partition (so one partition runs behind another): schema_change evolve takes every
    change from the newest position; an older message never narrows, drops or quarantines anything."""
    import random
    import zlib

    db = RoutedDatabase(prefix="srv", seed=26)
    messages = db.history({**PLAIN, **SHARDS}, changes=30, redeliver=0)
    messages += db.more(220, redeliver=25, earlier=messages, ddl=DDL, alterable=tuple(PLAIN))
    assert not DDL or {w.split()[0] for _, _, w in db.ddl_log} == {"add", "widen", "drop"}
    logs: dict[tuple[str, int], list] = {}
    for m in messages:
        logs.setdefault((m.topic, zlib.crc32(m.key) % 4), []).append(m)
    config = _config(tmp_path, RULES, schema_change="evolve")
    processor = BatchProcessor(config)
    rnd, read, batch_id = random.Random(3), {k: 0 for k in logs}, 0
    while any(read[k] < len(v) for k, v in logs.items()):
        taken = []
        for k, log_ in logs.items():
            n = rnd.randint(0, 4)
            taken += [(k[1], read[k] + i, m) for i, m in enumerate(log_[read[k]:read[k] + n])]
            read[k] = min(read[k] + n, len(log_))
        if not taken:
            continue
        n = len(taken)
        out = pa.Table.from_batches(list(processor.stage(iter([pa.RecordBatch.from_pydict({
            "topic": [m.topic for _, _, m in taken], "partition": [p for p, _, _ in taken],
            "offset": [o for _, o, _ in taken], "timestamp": [1_700_000_000_000] * n,
            "key": [m.key for _, _, m in taken], "value": [m.value for _, _, m in taken], EXPIRED: [0] * n},
            schema=ARROW_SCHEMA)]))))
        processor.process_decoded(out, batch_id)
        batch_id += 1
    assert batch_id > 15 and not processor.quarantine.tables
    for t in PLAIN:
        assert _table(f"{config.storage.root}/shop_{t}", ["id"]) == db.expected([t]), (t, db.ddl_log)
    assert _table(f"{config.storage.root}/orders", ["id"]) == db.expected(list(SHARDS))
