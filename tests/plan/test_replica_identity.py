"""Postgres without REPLICA IDENTITY FULL, in process (the graph on LocalRunner, the mirrors on the
service's decode stage and delta-rs sinks).

The key-change history of ``tests/keychange_history.py`` as Debezium's Postgres connector writes it
for tables with REPLICA IDENTITY DEFAULT: an update has no ``before``; a delete's ``before`` holds
only the key; an update of the primary key is a delete of the old key (key only) and a create of the
new one; and an unchanged TOASTed text column arrives as ``__debezium_unavailable_value``. With
``upsert: true`` the source's normalize state supplies every before-image and every unsent value,
so ``orders LEFT JOIN customers`` -> sales by region (an aggregate over the TOASTed ``region``) ->
top 2 equals DuckDB over the final state, and the mirrors equal the final state: the placeholder
is never stored.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.formats import make_decoder
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.config import UNAVAILABLE_VALUE, parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.service.views import pipeline_from_config
from changelake.types import arrow_schema
from tests.keychange_history import (
    GRAPH_TABLES,
    TABLES,
    KeyChangeDatabase,
    Message,
    encode,
    expected_graph_tables,
    pipeline_sections,
    raw_records,
    source_batches,
    topic,
)
from tests.plan.test_key_changes_plan import _fold

pytestmark = pytest.mark.unit

FMT = "debezium-json"
TOASTED = ("name", "region")      # text columns Postgres may leave out of an update (TOAST)


def replica_identity_default(messages: list[Message]) -> tuple[list[Message], int]:
    """The MySQL Debezium history as the Postgres connector writes it for REPLICA IDENTITY DEFAULT,
    and how many values it left out as TOASTed."""
    out, unsent = [], 0
    for m in messages:
        v = orjson.loads(m.value)
        table = v["source"]["table"]
        key = TABLES[table]["key"]
        v["source"] = {"connector": "postgresql", "db": "shop", "schema": "public", "table": table,
                       "ts_ms": v["source"]["ts_ms"], "lsn": v["source"]["pos"] * 100 + v["source"]["row"]}
        before, after = v["before"], v["after"]
        if v["op"] == "d":
            v["before"] = {key: before[key]}
        elif v["op"] == "u" and before[key] != after[key]:
            # Debezium writes a primary-key update as a delete of the old key and a create of the new one
            gone = dict(v, op="d", before={key: before[key]}, after=None)
            out.append(Message(m.topic, orjson.dumps({key: before[key]}), orjson.dumps(gone)))
            v = dict(v, op="c", before=None)
        elif v["op"] == "u":
            v["before"] = None
            for c in TOASTED:
                if c in after and after[c] == before[c] and after[c] is not None:
                    after[c] = UNAVAILABLE_VALUE
                    unsent += 1
        out.append(Message(m.topic, m.key, orjson.dumps(v)))
    return out, unsent


def _config(tmp_path, pipeline_id: str, *, views: bool = True, **source):
    sections = pipeline_sections("kc", [FMT], views=views)
    for s in sections["sources"]:
        s["options"] = {"upsert": True}
        s.update(source)
    raw = {"pipeline": {"id": pipeline_id, "checkpoint": str(tmp_path / "ckpt")},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")}, **sections}
    return parse_config(yaml.safe_dump(raw))


@pytest.fixture(scope="module")
def history():
    db = KeyChangeDatabase(seed=17).history(changes=240)
    messages, unsent = replica_identity_default(encode(db, FMT, topic_prefix="kc-dbz"))
    assert unsent > 20 and any(b'"op":"d"' in m.value for m in messages)
    return db, messages


def test_graph_retracts_from_state_through_a_join_and_an_aggregate(tmp_path, history):
    db, messages = history
    plan = pipeline_from_config(_config(tmp_path, "ri-graph")).plan()
    decoded = {}
    for table, spec in TABLES.items():
        decoder = make_decoder(FMT, columns=arrow_schema(spec["columns"]), options={"upsert": True})
        result = decoder.decode(raw_records([m for m in messages if m.topic == topic("kc", FMT, table)]))
        assert result.dead_letters.num_rows == 0
        decoded[f"dbz_{table}"] = result.rows
    runner = LocalRunner(plan)
    out: dict[str, dict] = {t: {} for t in GRAPH_TABLES}
    cuts = 6
    for b in range(cuts):
        inputs = {}
        for source, rows in decoded.items():
            n = pc.max(rows["_offset"]).as_py() + 1
            at = rows["_offset"]
            inputs[source] = rows.filter(pc.and_(pc.greater_equal(at, n * b // cuts), pc.less(at, n * (b + 1) // cuts)))
        for t, changes in runner.step(inputs).items():
            pk, columns, _ = GRAPH_TABLES[t.removeprefix("dbz_")]
            got = sink_changes(changes, primary_key=pk, batch_id=b)
            for c in columns:
                if pa.types.is_string(got.schema.field(c).type):
                    assert not pc.any(pc.equal(got[c], UNAVAILABLE_VALUE)).as_py(), (t, c)
            _fold(out[t.removeprefix("dbz_")], got, pk, columns)
    expected = expected_graph_tables(db)
    for t in GRAPH_TABLES:
        assert set(out[t].values()) == expected[t], t


def test_mirrors_keep_the_stored_value_of_a_toasted_column(tmp_path, history):
    db, messages = history
    config = _config(tmp_path, "ri-mirror", views=False)
    processor = BatchProcessor(config)
    for b, batch in enumerate(source_batches(messages, 90)):
        processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([batch])))), b)
    assert not processor.totals.dead_letters
    for table, spec in TABLES.items():
        rows = read_delta(config.table_path(f"dbz_{table}"), columns=list(spec["columns"])).to_pylist()
        assert {r[spec["key"]]: r for r in rows} == db.state[table], table


def test_a_graph_source_without_normalize_cannot_fill_unavailable_values(tmp_path):
    from changelake.errors import ConfigError
    from changelake.plan import Pipeline

    with pytest.raises(ConfigError, match="filled from the normalize state"):
        Pipeline().source("s", columns={"id": "bigint", "t": "string"}, primary_key=["id"], normalize=False,
                          unavailable_value=UNAVAILABLE_VALUE)


def test_the_formats_doc_example_mirrors_a_replica_identity_default_table(tmp_path, history):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    start = text.index("## Postgres without REPLICA IDENTITY FULL")
    section = text[start:text.index("\n## ", start + 1)]
    body = next(b for lang, b in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL) if lang == "yaml")
    header = {"pipeline": {"id": "ri-doc", "checkpoint": str(tmp_path / "ckpt")},
              "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")}}
    config = parse_config(yaml.safe_dump(header) + body)
    db, messages = history
    customers = [Message("pg.public.customers", m.key, m.value) for m in messages
                 if m.topic == topic("kc", FMT, "customers")]
    processor = BatchProcessor(config)
    for b, batch in enumerate(source_batches(customers, 50)):
        processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([batch])))), b)
    rows = read_delta(config.table_path("customers"), columns=["id", "name", "region"]).to_pylist()
    assert {r["id"]: r for r in rows} == db.state["customers"]
