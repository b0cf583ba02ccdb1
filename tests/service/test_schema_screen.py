"""The per-table screen of schema changes (changelake.service.quarantine), on a real Delta table, no JVM:
a refused change quarantines the table with every raw message kept; convert sets aside only the messages
whose value the table's type cannot hold; a restarted decoder starts from the table's columns."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.formats.debezium_json import DebeziumJsonDecoder
from changelake.service.config import ChangelakeConfig
from changelake.service.key_inference import TableKeys
from changelake.service.quarantine import Quarantine
from tests.formats.helpers import records

pytestmark = pytest.mark.unit


def _change(fields: list[tuple[str, str]], after: dict, pos: int) -> dict:
    row = {"type": "struct", "optional": True, "fields": [{"type": t, "field": n, "optional": n != "id"}
                                                          for n, t in fields]}
    schema = {"type": "struct", "fields": [dict(row, field="before"), dict(row, field="after")]}
    return {"schema": schema, "payload": {"op": "c", "before": None, "after": after,
                                          "source": {"file": "mysql-bin.000001", "pos": pos}}}


V1 = [("id", "int32"), ("qty", "int32"), ("name", "string")]
WIDE = [("id", "int32"), ("qty", "int64"), ("name", "string")]
NAME_IS_INT = [("id", "int32"), ("qty", "int32"), ("name", "int64")]


def _setup(tmp_path, behaviour: str):
    config = ChangelakeConfig.model_validate({
        "pipeline": {"id": "screen", "checkpoint": str(tmp_path / "ckpt")},
        "kafka": {"bootstrap_servers": "k:9092"},
        "sources": [{"name": "items", "topics": ["shop.items"], "table": "items", "schema_change": behaviour,
                     "options": {"schema-include": True}}],
        "tables": [{"name": "items", "primary_key": ["id"]}],
        "storage": {"root": str(tmp_path / "lake")}})
    decoder = DebeziumJsonDecoder(options={"schema-include": True})
    first = decoder.decode(records([_change(V1, {"id": 1, "qty": 1, "name": "a"}, 1)], topic="shop.items"))
    open_sink(TableSpec(name="items", path=config.table_path("items"), primary_key=("id",)),
              pipeline_id="screen").apply(first.rows, batch_id=0)
    return config, Quarantine(config, TableKeys(config)), decoder


def _screen(quarantine, decoder, raw):
    result = decoder.decode(raw)
    return quarantine.screen("items", source="items", decoder=decoder, raw=raw, rows=result.rows,
                             dead_letters=result.dead_letters)


def test_a_refused_change_quarantines_the_table_with_every_raw_message_until_a_restart(tmp_path):
    _, quarantine, decoder = _setup(tmp_path, "lenient")
    raw = records([_change(V1, {"id": 2, "qty": 2, "name": "b"}, 2),
                   _change(NAME_IS_INT, {"id": 3, "qty": 3, "name": 7}, 3)], topic="shop.items")
    out = _screen(quarantine, decoder, raw)
    assert out.rows.num_rows == 0
    assert out.dead_letters["value"].to_pylist() == raw["value"].to_pylist()          # raw bytes, none lost
    assert set(out.dead_letters["reason"].to_pylist()) == {"schema-incompatible"}
    assert "column 'name' changed from string to int64" in out.dead_letters["error"][0].as_py()
    later = records([_change(V1, {"id": 4, "qty": 4, "name": "d"}, 4)], topic="shop.items", first_offset=200)
    assert _screen(quarantine, decoder, later).dead_letters["offset"].to_pylist() == [200]
    assert "items" in quarantine.tables


def test_convert_sets_aside_only_the_values_the_table_type_cannot_hold(tmp_path):
    _, quarantine, decoder = _setup(tmp_path, "ignore")
    raw = records([_change(WIDE, {"id": 2, "qty": 5, "name": "b"}, 2),
                   _change(WIDE, {"id": 3, "qty": 2**40, "name": "c"}, 3)], topic="shop.items")
    out = _screen(quarantine, decoder, raw)
    assert out.rows.schema.field("qty").type == pa.int32() and out.rows["id"].to_pylist() == [2]
    assert out.dead_letters["reason"].to_pylist() == ["schema-mismatch"]
    assert orjson.loads(out.dead_letters["value"][0].as_py())["payload"]["after"]["id"] == 3
    assert not quarantine.tables


def test_a_restarted_decoder_reads_an_older_schema_as_the_table_holds_it(tmp_path):
    _, quarantine, _ = _setup(tmp_path, "try_evolve")
    fresh = DebeziumJsonDecoder(options={"schema-include": True})
    quarantine.prepare("items", fresh)
    raw = records([_change(NAME_IS_INT, {"id": 5, "qty": 5, "name": 9}, 5),
                   _change(V1, {"id": 6, "qty": 6, "name": "f"}, 6)], topic="shop.items")
    out = _screen(quarantine, fresh, raw)
    assert out.rows.select(["id", "name"]).to_pylist() == [{"id": 5, "name": "9"}, {"id": 6, "name": "f"}]
    assert out.dead_letters.num_rows == 0 and out.dropped == ()


def test_after_a_restart_an_older_message_neither_drops_an_added_column_nor_narrows_a_widened_one(tmp_path):
    from changelake.connectors.delta_read import read_delta
    from changelake.connectors.delta_sink import TableSpec, open_sink

    config, quarantine, decoder = _setup(tmp_path, "evolve")
    newer = [("id", "int32"), ("qty", "int64"), ("name", "string"), ("lot", "string")]
    raw = records([_change(newer, {"id": 2, "qty": 2**40, "name": "b", "lot": "L2"}, 50)], topic="shop.items")
    out = _screen(quarantine, decoder, raw)
    sink = open_sink(TableSpec(name="items", path=config.table_path("items"), primary_key=("id",),
                               schema_change="evolve"), pipeline_id="screen")
    sink.apply(out.rows, batch_id=1, dropped_columns=out.dropped, schema_position=out.position)
    # restarted: a fresh screen and decoder; a re-delivered change from before the ALTER (position 1 < 50)
    again, fresh = Quarantine(config, quarantine.keys), DebeziumJsonDecoder(options={"schema-include": True})
    again.prepare("items", fresh)
    old = records([_change(V1, {"id": 1, "qty": 7, "name": "a2"}, 1)], topic="shop.items", first_offset=300)
    result = fresh.decode(old)
    late = again.screen("items", source="items", decoder=fresh, raw=old, rows=result.rows,
                        dead_letters=result.dead_letters)
    assert (late.dropped, late.position, late.dead_letters.num_rows, again.tables) == ((), None, 0, {})
    assert late.rows.schema.field("qty").type == pa.int64()
    sink.apply(late.rows, batch_id=2, dropped_columns=late.dropped, schema_position=late.position)
    table = read_delta(config.table_path("items"))
    assert {f.name: f.type for f in table.schema if not f.name.startswith("_")} == {
        "id": pa.int32(), "qty": pa.int64(), "name": pa.string(), "lot": pa.string()}
    assert sorted(table.select(["id", "qty", "lot"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "qty": 7, "lot": None}, {"id": 2, "qty": 2**40, "lot": "L2"}]


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("behaviour", ["evolve", "lenient"])
def test_a_schema_between_the_last_change_and_the_newest_position_read_is_older(tmp_path, restart, behaviour):
    """ADD lot at 20 and DROP lot at 40: the change at 50 (no lot) is read first, from a partition ahead; the
    changes at 26, 27 (with lot) come later, from a partition behind. evolve: lot is not added back. lenient,
    which loses nothing: lot is added with the values read, as if the partitions had been read in order
    (added at 20, kept at the drop)."""
    from changelake.connectors.delta_read import read_delta
    from changelake.connectors.delta_sink import TableSpec, open_sink

    config, quarantine, decoder = _setup(tmp_path, behaviour)
    sink = open_sink(TableSpec(name="items", path=config.table_path("items"), primary_key=("id",)),
                     pipeline_id="screen")
    ahead = records([_change(V1, {"id": 5, "qty": 5, "name": "e"}, 50)], topic="shop.items", partition=0)
    out = _screen(quarantine, decoder, ahead)
    sink.apply(out.rows, batch_id=1, dropped_columns=out.dropped, schema_position=out.position)
    quarantine.advance({"items": out.position} if out.position else {})
    if restart:
        quarantine, decoder = Quarantine(config, quarantine.keys), DebeziumJsonDecoder(options={"schema-include": True})
        quarantine.prepare("items", decoder)
    with_lot = V1 + [("lot", "string")]
    behind = records([_change(with_lot, {"id": i, "qty": i, "name": "b", "lot": f"L{i}"}, 20 + i) for i in (6, 7)],
                     topic="shop.items", partition=1)
    late = _screen(quarantine, decoder, behind)
    assert late.position is None and late.dropped == ()      # the recorded position stays 50
    sink.apply(late.rows, batch_id=2, dropped_columns=late.dropped, schema_position=late.position)
    table = read_delta(config.table_path("items"))
    if behaviour == "evolve":
        assert "lot" not in late.rows.column_names
        assert [f.name for f in table.schema if not f.name.startswith("_")] == ["id", "qty", "name"]
    else:
        assert [f.name for f in table.schema if not f.name.startswith("_")] == ["id", "qty", "name", "lot"]
        assert sorted(table.select(["id", "lot"]).to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "lot": None}, {"id": 5, "lot": None}, {"id": 6, "lot": "L6"}, {"id": 7, "lot": "L7"}]
